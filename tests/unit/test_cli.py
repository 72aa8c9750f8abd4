"""pdctl render/validate/crd, run as a user runs them."""

from __future__ import annotations

import subprocess
import sys

import yaml

from tests.conftest import EXAMPLES, ROOT

PDCTL = [sys.executable, "-m", "pd_operator.cli"]
SGLANG_MOONCAKE = ROOT / "manifests" / "examples" / "sglang-mooncake.yaml"


def run(*args, stdin: str | None = None):
    return subprocess.run(PDCTL + list(args), input=stdin, capture_output=True, text=True, cwd=ROOT)


def test_render_every_example():
    for path in EXAMPLES:
        res = run("render", "-f", str(path))
        assert res.returncode == 0, res.stderr
        kinds = [d["kind"] for d in yaml.safe_load_all(res.stdout)]
        # one workload per pool: a StatefulSet, or a LeaderWorkerSet when a replica spans nodes
        assert kinds.count("StatefulSet") + kinds.count("LeaderWorkerSet") == 2 and "Deployment" in kinds, path


def test_bad_input_names_field_prints_nothing_to_stdout():
    bad = (SGLANG_MOONCAKE.read_text()).replace("tensorParallelSize: 4\n    gpuProduct: NVIDIA-H200\n  decode", "tensorParallelSize: 16\n    nodesPerReplica: 3\n    gpuProduct: NVIDIA-H200\n  decode")
    assert bad != SGLANG_MOONCAKE.read_text()
    res = run("render", "-f", "-", stdin=bad)
    assert res.returncode == 1
    assert res.stdout == ""
    assert "spec.prefill.nodesPerReplica" in res.stderr and "split evenly over its nodes" in res.stderr


def test_missing_file_and_empty_input():
    assert run("render", "-f", "/nonexistent.yaml").returncode == 2
    res = run("render", "-f", "-", stdin="")
    assert res.returncode == 2 and res.stdout == ""


def test_namespace_flag_fills_missing_namespace():
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    del doc["metadata"]["namespace"]
    res = run("render", "-f", "-", "-n", "prod", stdin=yaml.safe_dump(doc))
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(res.stdout)} == {"prod"}


def test_crd_command_prints_committed_crd():
    assert run("crd").stdout == (ROOT / "crds" / "pdinferenceservices.yaml").read_text()


def test_validate():
    assert run("validate", "-f", str(EXAMPLES[0])).returncode == 0
    res = run("validate", "-f", "-", stdin="apiVersion: pdserving.io/v1alpha1\nkind: PDInferenceService\nmetadata: {name: x}\nspec: {engine: {kind: vllm}}\n")
    assert res.returncode == 1 and "spec.model: required" in res.stderr
