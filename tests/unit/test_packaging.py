"""The runtime distribution ships the operator only; the tools are their own
distribution, installed by the ``tools`` extra, and pdctl finds their commands."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pd_operator import cli

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def runtime_wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True)
    (whl,) = out.glob("pd_operator-*.whl")
    return zipfile.ZipFile(whl)


def test_runtime_wheel_holds_no_tools(runtime_wheel):
    names = runtime_wheel.namelist()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert packages == {"pd_operator"}
    assert not [n for n in names if "/enginesim/" in n or "/autoscalesim/" in n or "/loadgen/" in n or "plot" in n]
    # the data the runtime reads at run time is in it
    assert "pd_operator/perfmodel/calibration/h200-qwen3-8b-shape.json" in names
    assert any(n.startswith("pd_operator/render/engines/flagsets/") and n.endswith(".json") for n in names)
    meta = runtime_wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Dist: pd-operator-tools==0.1.0; extra == \"tools\"" in meta


def test_importing_the_whole_runtime_pulls_in_no_tool_or_plotting_code(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"  # the handlers module builds its API client at import
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                          "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
                          "current-context: x\n")
    code = ("import pkgutil, importlib, sys, pd_operator\n"
            "for m in pkgutil.walk_packages(pd_operator.__path__, 'pd_operator.'):\n"
            "    if m.name.endswith('__main__'): continue\n"
            "    importlib.import_module(m.name)\n"
            "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('pd_operator_tools', 'matplotlib'))\n"
            "print(' '.join(bad))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "KUBECONFIG"} | {"KUBECONFIG": str(kubeconfig)}
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env).stdout.strip()
    assert out == ""


def test_pdctl_without_the_tools_says_how_to_get_them(monkeypatch, capsys):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    assert cli.main(["bench", "--url", "http://127.0.0.1:1"]) == 2
    assert "pip install 'pd-operator[tools]'" in capsys.readouterr().err
    assert cli.main(["validate", "-f", str(ROOT / "manifests/examples/vllm-nixl.yaml")]) == 0


def test_pdctl_with_the_tools_has_every_command():
    choices = cli.build_parser()._subparsers._group_actions[0].choices
    assert set(cli.TOOL_COMMANDS) <= set(choices)
    assert choices["bench"].get_default("func").__module__ == "pd_operator_tools.loadgen"


def test_pdctl_validate_reads_what_kubectl_get_writes(tmp_path, capsys):
    """`kubectl get pdservices -A -o yaml` is one List of stored objects (status, managedFields,
    resourceVersion): the check before an upgrade (charts/pd-operator/README.md) reads each item."""
    import copy

    import yaml

    from tests.conftest import minimal

    good = minimal("vllm")
    good["metadata"].update({"namespace": "team-a", "resourceVersion": "12", "uid": "u-1", "generation": 3,
                             "managedFields": [{"manager": "kubectl", "operation": "Apply"}]})
    good["status"] = {"observedGeneration": 3}
    bad = copy.deepcopy(good)
    bad["metadata"]["name"] = "bad"
    bad["spec"].setdefault("decode", {})["extraArgs"] = ["--no-such-flag"]
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [good, bad]}))
    assert cli.main(["validate", "-f", str(path)]) == 1
    out = capsys.readouterr()
    assert f"{good['metadata']['name']}: valid" in out.out
    assert "'bad'" in out.err and "spec.decode.extraArgs" in out.err and "--no-such-flag" in out.err
