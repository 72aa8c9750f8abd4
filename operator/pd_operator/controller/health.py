"""Liveness tied to the operator's own loops.

Each long-running loop (the autoscaler, the resync) beats at every turn with
the age after which it counts as stuck; ``/healthz`` answers 200 while every
loop beat recently and 503 naming the stuck loops otherwise, so the kubelet
restarts an operator whose loop hangs instead of leaving it frozen behind a
200.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._beats: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def beat(self, name: str, max_age: float) -> None:
        """``name`` made progress now; it is stuck if it does not beat again within ``max_age`` seconds."""
        with self._lock:
            self._beats[name] = (self.clock(), max_age)

    def forget(self, name: str) -> None:
        with self._lock:
            self._beats.pop(name, None)

    def stuck(self) -> dict[str, float]:
        """Loops whose last beat is older than their max age -> seconds since that beat."""
        now = self.clock()
        with self._lock:
            return {n: now - at for n, (at, max_age) in self._beats.items() if now - at > max_age}


HEALTH = Health()


def default_bind() -> str:
    """``::`` (every IPv6 and IPv4 address, see ``http_server``) where the node has IPv6,
    else ``0.0.0.0``. An IPv4-only listener refuses the kubelet's probes and the
    Services' traffic on an IPv6 single-stack cluster, where the pod IP is IPv6."""
    try:
        socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
    except OSError:
        return "0.0.0.0"
    return "::"


def http_server(cls: type[ThreadingHTTPServer], host: str, port: int, handler) -> ThreadingHTTPServer:
    """``cls`` listening on ``host``:``port`` in the address family of ``host`` (http.server's
    default, AF_INET, cannot bind an IPv6 address); ``::`` also takes IPv4 (IPV6_V6ONLY off,
    whatever net.ipv6.bindv6only says)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(cls):
        address_family = family

        def server_bind(self):
            if family == socket.AF_INET6 and host in ("::", ""):
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    return Server((host, port), handler)


def serve_metrics(host: str, port: int) -> ThreadingHTTPServer:
    """Serve the Prometheus registry (every path, as prometheus_client's own server) on a
    daemon thread, through :func:`http_server`: prometheus_client's ``start_http_server``
    leaves IPV6_V6ONLY as the host sets it, so on ``::`` with net.ipv6.bindv6only=1 an
    IPv4 scrape was refused."""
    from prometheus_client import REGISTRY
    from prometheus_client.exposition import MetricsHandler

    server = http_server(ThreadingHTTPServer, host, port, MetricsHandler.factory(REGISTRY))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def serve(health: Health, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/healthz`` on a daemon thread; returns the server (``.shutdown()`` stops it)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.split("?", 1)[0] != "/healthz":
                self.send_error(404)
                return
            stuck = health.stuck()
            body = json.dumps({"ok": not stuck, "stuck": {n: round(s, 1) for n, s in stuck.items()}}).encode()
            self.send_response(503 if stuck else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http_server(ThreadingHTTPServer, host, port, Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server
