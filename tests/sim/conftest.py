"""Helpers for the simulator tests: start sims (and routers) as processes on loopback."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
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
