"""Shared helpers for the test suite."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


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
    return obj


def load_example(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture
def examples():
    return {p.stem: load_example(p) for p in EXAMPLES}
