"""Helpers for the simulator tests: start sims (and routers) as processes on loopback."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pd_operator.api import validate_service
from pd_operator.render import render

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "manifests" / "examples"
ROUTER_PINS = ["vllm-router==0.1.17", "sglang-router==0.3.2"]


def loopback_host() -> str:
    """A random 127.x.y.z (all of 127/8 is local): parallel runs do not collide."""
    return f"127.{random.randint(101, 250)}.{random.randint(0, 255)}.{random.randint(2, 254)}"


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}) before {url} answered: "
                               f"{proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except Exception as exc:  # noqa: BLE001 - keep polling
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer in {timeout}s: {last}")


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def stream_chat(base: str, model: str, prompt: str, max_tokens: int,
                api_key: str | None = None) -> tuple[list[str], set[str], bool]:
    """A streamed chat completion: (content pieces, model names seen, [DONE] seen)."""
    import json

    body = {"model": model, "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": prompt}]}
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    req = urllib.request.Request(base + "/v1/chat/completions", method="POST", data=json.dumps(body).encode(),
                                 headers=headers)
    pieces, models, done = [], set(), False
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            models.add(chunk.get("model"))
            for ch in chunk.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    pieces.append(ch["delta"]["content"])
    return pieces, models, done


def parse_metrics(text: str) -> dict[str, float]:
    """{'name{labels}': value} of a Prometheus text page (no comments)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def metric(text: str, name: str) -> float:
    """Sum of every series of ``name`` (any labels)."""
    total, found = 0.0, False
    for key, val in parse_metrics(text).items():
        if key == name or key.startswith(name + "{"):
            total += val
            found = True
    if not found:
        raise KeyError(name)
    return total


def rendered_engine(example: str, role: str) -> tuple[list[str], dict[str, str]]:
    """The engine command and plain env of one pool of a rendered example."""
    import yaml

    svc = validate_service(yaml.safe_load((EXAMPLES / f"{example}.yaml").read_text()))
    for obj in render(svc):
        if obj["kind"] == "StatefulSet" and obj["metadata"]["name"].endswith(f"-{role}"):
            c = obj["spec"]["template"]["spec"]["containers"][0]
            env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
            return list(c["command"]) + list(c.get("args", [])), env
    raise LookupError(f"{example}: no {role} StatefulSet")


class Procs:
    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        p = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        self.procs.append(p)
        return p

    def sim(self, engine_argv: list[str], host: str, port: int, *, sim_opts: list[str] = (),
            env: dict | None = None, wait: bool = True) -> subprocess.Popen:
        argv = [sys.executable, "-m", "pd_operator_tools.enginesim", "--bind", host, "--bind-port", str(port),
                *sim_opts, "--", *engine_argv]
        p = self.start(argv, env)
        if wait:
            wait_http(f"http://{host}:{port}/health", proc=p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.stop()


def router_python() -> Path:
    """Python of the routers' own venv (created and pinned if missing); skip if impossible."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    venv = cache / "pd-operator" / "venvs" / "routers"
    py = venv / "bin" / "python"
    check = [str(py), "-c", "import vllm_router, sglang_router, importlib.metadata as m; "
             "assert m.version('vllm-router') == '0.1.17' and m.version('sglang-router') == '0.3.2'"]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    try:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", *ROUTER_PINS], check=True,
                       capture_output=True, timeout=600)
        subprocess.run(check, check=True, capture_output=True)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"cannot create the router venv {venv} with {' '.join(ROUTER_PINS)}: {exc}")
    return py


@pytest.fixture(scope="session")
def router_py() -> Path:
    return router_python()


# --------------------------------------------------------------------------
# Real Prometheus scraping targets on loopback
# --------------------------------------------------------------------------


def scraped(url: str, targets: int, timeout: float = 30.0, samples: int = 2, window: str = "1m") -> None:
    """Wait until Prometheus has scraped every target at least ``samples`` times within ``window``."""
    deadline = time.monotonic() + timeout
    q = f"count_over_time(up[{window}]) >= {samples}"
    while time.monotonic() < deadline:
        body = json.loads(get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": q}))[1])
        if len(body["data"]["result"]) >= targets:
            return
        time.sleep(0.5)
    raise TimeoutError("Prometheus did not scrape the targets")


def start_prometheus(procs, tmp_path, jobs: dict[str, list[tuple[str, int, dict]]]) -> str:
    """Prometheus scraping every second: job -> [(host, port, labels)]; its URL once ready."""
    return start_prometheus_with(procs, tmp_path, [
        {"job_name": job, "static_configs": [{"targets": [f"{host}:{port}"], "labels": labels} for host, port, labels in targets]}
        for job, targets in jobs.items()], sum(len(t) for t in jobs.values()))


def start_prometheus_with(procs, tmp_path, scrape_configs: list[dict], targets: int) -> str:
    """Prometheus scraping every second with these jobs; its URL once it scraped ``targets`` targets."""
    from tests.conftest import prometheus_binary

    binary = prometheus_binary()
    if binary is None:
        pytest.skip("needs prometheus (tests/run.sh builds it)")
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": scrape_configs}
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))  # JSON is YAML
    host = loopback_host()
    port = free_port(host)
    procs.start([binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address={host}:{port}"])
    url = f"http://{host}:{port}"
    wait_http(url + "/-/ready", timeout=30)
    scraped(url, targets)  # samples before the load: rate() needs the counter's start
    return url


def query(url: str, promql: str) -> list[dict]:
    """An instant query's result vector (raises on an error answer)."""
    status, text = get(url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    body = json.loads(text)
    assert status == 200 and body["status"] == "success", (promql, text)
    return body["data"]["result"]


class Exporter:
    """A metrics page on loopback whose samples the test writes.

    ``page(scrape, elapsed)`` returns ``{series: value}`` (``'name{le="0.1"}'``)
    for the ``scrape``-th request (from 1), ``elapsed`` seconds after the
    exporter started: a counter written as ``slope * elapsed`` grows at
    exactly ``slope`` per second whenever Prometheus scrapes it, so
    ``rate()`` over it is ``slope`` whatever the scrape times were.
    """

    def __init__(self, page: Callable[[int, float], dict[str, float]], host: str | None = None, port: int = 0):
        self.page, self.scrapes, self.t0 = page, 0, time.monotonic()
        self.first_scrape: float | None = None
        lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                now = time.monotonic()
                with lock:
                    exporter.scrapes += 1
                    n = exporter.scrapes
                    if exporter.first_scrape is None:
                        exporter.first_scrape = now
                lines = [f"{k} {v!r}" for k, v in exporter.page(n, now - exporter.t0).items()]
                data = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.host = host or loopback_host()
        self.server = ThreadingHTTPServer((self.host, port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def exporters():
    """Exporter(page) factory; every exporter is closed afterwards."""
    made: list[Exporter] = []

    def make(page):
        made.append(Exporter(page))
        return made[-1]

    yield make
    for e in made:
        e.close()
