"""A PNG of a benchmark run, with the standard library only (zlib + struct).

Two panels over the request start time: TTFT per request (top) and mean ITL
per request (bottom), each with its SLO as a red line; failed requests are
red ticks on the time axis.  Labels use a built-in 3x5 pixel font (upper
case, digits, a few symbols), so no plotting library is needed.
"""

from __future__ import annotations

import struct
import zlib

_FONT = {
    "A": "010101111101101", "B": "110101110101110", "C": "011100100100011", "D": "110101101101110",
    "E": "111100110100111", "F": "111100110100100", "G": "011100101101011", "H": "101101111101101",
    "I": "111010010010111", "J": "001001001101010", "K": "101101110101101", "L": "100100100100111",
    "M": "101111111101101", "N": "110101101101101", "O": "010101101101010", "P": "110101110100100",
    "Q": "010101101110011", "R": "110101110101101", "S": "011100010001110", "T": "111010010010010",
    "U": "101101101101111", "V": "101101101101010", "W": "101101111111101", "X": "101101010101101",
    "Y": "101101010010010", "Z": "111001010100111",
    "0": "111101101101111", "1": "010110010010111", "2": "110001010100111", "3": "110001010001110",
    "4": "101101111001001", "5": "111100110001110", "6": "011100111101111", "7": "111001010010010",
    "8": "111101111101111", "9": "111101111001110",
    ".": "000000000000010", "-": "000000111000000", ":": "000010000010000", "/": "001001010100100",
    "(": "010100100100010", ")": "010001001001010", "<": "001010100010001", "%": "101001010100101",
    " ": "000000000000000", "=": "000111000111000",
}

WHITE, BLACK, GREY = (255, 255, 255), (0, 0, 0), (200, 200, 200)
BLUE, RED, GREEN = (31, 119, 180), (214, 39, 40), (44, 160, 44)


class Canvas:
    def __init__(self, w: int, h: int):
        self.w, self.h = w, h
        self.px = bytearray(WHITE * (w * h))

    def set(self, x: int, y: int, c: tuple) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i:i + 3] = bytes(c)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: tuple) -> None:
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, c)

    def hline(self, x0: int, x1: int, y: int, c: tuple, dash: int = 0) -> None:
        for x in range(x0, x1 + 1):
            if not dash or (x // dash) % 2 == 0:
                self.set(x, y, c)

    def vline(self, x: int, y0: int, y1: int, c: tuple) -> None:
        for y in range(y0, y1 + 1):
            self.set(x, y, c)

    def text(self, x: int, y: int, s: str, c: tuple = BLACK, scale: int = 2) -> None:
        for ch in s.upper():
            glyph = _FONT.get(ch, _FONT[" "])
            for i, bit in enumerate(glyph):
                if bit == "1":
                    self.rect(x + (i % 3) * scale, y + (i // 3) * scale,
                              x + (i % 3) * scale + scale - 1, y + (i // 3) * scale + scale - 1, c)
            x += 4 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(self.px[y * self.w * 3:(y + 1) * self.w * 3]) for y in range(self.h))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def _fmt(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def _panel(cv: Canvas, top: int, height: int, title: str, pts: list, slo_ms: float, t_max: float,
           fails: list) -> None:
    left, right = 70, cv.w - 20
    bottom = top + height
    y_max = max([v for _, v in pts] + [slo_ms * 1.2, 1e-6])
    cv.text(left, top - 18, title)
    cv.vline(left, top, bottom, BLACK)
    cv.hline(left, right, bottom, BLACK)
    for k in range(5):
        v = y_max * k / 4
        y = bottom - int(v / y_max * height)
        cv.hline(left - 4, left, y, BLACK)
        if k:
            cv.hline(left + 1, right, y, GREY, dash=4)
        cv.text(5, y - 5, _fmt(v))
    for k in range(6):
        t = t_max * k / 5
        x = left + int(t / t_max * (right - left))
        cv.vline(x, bottom, bottom + 4, BLACK)
        cv.text(x - 8, bottom + 8, _fmt(t))
    ys = bottom - int(slo_ms / y_max * height)
    cv.hline(left + 1, right, ys, RED, dash=6)
    cv.text(right - 90, ys - 14, f"SLO {_fmt(slo_ms)}", RED)
    for t, v in pts:
        x = left + int(t / t_max * (right - left))
        y = bottom - int(v / y_max * height)
        cv.rect(x - 1, y - 1, x + 1, y + 1, BLUE)
    for t in fails:
        x = left + int(t / t_max * (right - left))
        cv.vline(x, bottom - 6, bottom, RED)


def render_png(results: list, ttft_slo: float = 1.0, itl_slo: float = 0.05) -> bytes:
    cv = Canvas(900, 560)
    ok = [r for r in results if r.ok]
    t_max = max([r.start + (r.latency or 0) for r in results] + [1e-3])
    fails = [r.start for r in results if not r.ok]
    _panel(cv, 40, 200, "TTFT PER REQUEST (MS) VS START TIME (S)", [(r.start, r.ttft * 1e3) for r in ok],
           ttft_slo * 1e3, t_max, fails)
    _panel(cv, 310, 200, "MEAN ITL PER REQUEST (MS) VS START TIME (S)",
           [(r.start, r.mean_itl * 1e3) for r in ok if r.mean_itl is not None], itl_slo * 1e3, t_max, fails)
    cv.text(70, 540, f"{len(ok)}/{len(results)} OK", GREEN if len(ok) == len(results) else RED)
    return cv.png()


def write_png(path: str, results: list, ttft_slo: float = 1.0, itl_slo: float = 0.05) -> None:
    with open(path, "wb") as fh:
        fh.write(render_png(results, ttft_slo, itl_slo))
