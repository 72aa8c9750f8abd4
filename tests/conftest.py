"""Shared helpers for the test suite."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def load_e2e_module(stem: str):
    """e2e/<stem>.py (cluster, harness), imported by path once (e2e/ is not a package)."""
    import importlib.util
    import sys

    name = f"pd_e2e_{stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "e2e" / f"{stem}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def prometheus_binary(name: str = "prometheus") -> str | None:
    """prometheus or promtool as e2e/controlplane/build.sh builds them (with
    kubernetes_sd, which Debian's package lacks); else the one on PATH."""
    import shutil

    built = load_e2e_module("cluster").binary(name)
    return str(built) if built.is_file() else shutil.which(name)


def minimal(kind: str = "vllm", **spec) -> dict:
    """The smallest valid PDInferenceService, with spec fields overridden."""
    obj = {
        "apiVersion": "pdserving.io/v1alpha1",
        "kind": "PDInferenceService",
        "metadata": {"name": "svc", "namespace": "ns"},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": kind}},
    }
    for key, value in spec.items():
        obj["spec"][key] = copy.deepcopy(value)
    # router.image is required (no published image has the pinned router launchers)
    router = obj["spec"].setdefault("router", {})
    if isinstance(router, dict):
        router.setdefault("image", f"registry.example.com/pd/{'vllm' if kind == 'vllm' else 'sglang'}-router:test")
    return obj


def load_example(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def examples():
    return {p.stem: load_example(p) for p in EXAMPLES}
