"""The flag-set snapshots come from the pinned releases' own source, checked in CI.

The ``realparser`` tests (test_flagsets.py) compare the snapshots with a live
extraction, but only where the engines are installed (9-11 GB each), which CI
is not. These tests need no engine:

* offline: every snapshot is the one its extraction wrote (its sha256 is in
  tests/contract/flagset_sources.json, written by the same run), for the
  version the extractor and the operator pin; a snapshot edited by hand, or a
  pin moved without a re-extraction, fails;
* ``network``: the sha256 of the engine modules each extraction imported
  (extract_flagsets.PARSER_SOURCES) equals that of the same files in the
  pinned wheels, downloaded from PyPI with pip (about 410 MB, seconds on a
  CI runner); a snapshot extracted from other sources than the pinned
  release fails.

The fix for any failure here is the same: re-run
``tests/contract/extract_flagsets.py COMPONENT`` in the component's venv (see
its docstring) and review the diff.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pd_operator.api.constants import ENGINE_VERSIONS, ROUTER_VERSIONS
from tests.contract import extract_flagsets as ex

MANIFEST = json.loads(ex.SOURCES_MANIFEST.read_text())
FIX = "re-run tests/contract/extract_flagsets.py {c} in its venv (see its docstring) and review the diff"
# The wheels PyPI has for the pins are manylinux x86_64 ones; the Python source
# in them is what any platform's wheel has.
WHEEL_TAGS = ["--only-binary=:all:", "--implementation", "cp", "--python-version", "3.11",
              *[a for p in ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64")
                for a in ("--platform", p)]]


def test_the_operator_renders_the_versions_that_were_extracted():
    assert ex.PINS == {"vllm": ENGINE_VERSIONS["vllm"][0], "sglang": ENGINE_VERSIONS["sglang"][0], **ROUTER_VERSIONS}


@pytest.mark.parametrize("component", sorted(ex.PINS))
def test_each_snapshot_is_the_one_its_extraction_wrote(component):
    entry = MANIFEST.get(component)
    assert entry, f"{component} has no entry in {ex.SOURCES_MANIFEST.name}: " + FIX.format(c=component)
    assert entry["version"] == ex.PINS[component], \
        f"{component} is pinned to {ex.PINS[component]} but was extracted at {entry['version']}: " + FIX.format(c=component)
    snapshot = ex.DEFAULT_OUT / entry["snapshot"]
    assert snapshot.name == ex.snapshot_filename(component, ex.PINS[component])
    assert ex.sha256_file(snapshot) == entry["snapshot_sha256"], \
        f"{snapshot.name} is not the file its extraction wrote (edited by hand?): " + FIX.format(c=component)
    assert json.loads(snapshot.read_text())["version"] == entry["version"]
    assert sorted(entry["sources"]) == sorted(ex.PARSER_SOURCES[component]), \
        f"PARSER_SOURCES changed since {component} was extracted: " + FIX.format(c=component)


ROOTS = {"vllm": "vllm", "sglang": "sglang", "vllm_router": "vllm-router", "sglang_router": "sglang-router"}


def _imports() -> list[set[str]]:
    """What extract_flagsets.py imports of the engines and routers: per import,
    the modules it may name ("from a.b import c": a.b.c if c is a submodule,
    else a.b). Import statements, and the module names given to
    importlib.import_module (literals, or f"{pkg}.name" for both routers) or
    to _extract_router."""
    tree = ast.parse(Path(ex.__file__).read_text())
    found: list[set[str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [{a.name} for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [{f"{node.module}.{a.name}", node.module} for a in node.names]
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name == "import_module":
                for sub in ast.walk(node.args[0]):
                    if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                        found.append({sub.value})
                    elif isinstance(sub, ast.JoinedStr) and isinstance(sub.values[-1], ast.Constant):
                        found.append({f"{root}{sub.values[-1].value}" for root in ("vllm_router", "sglang_router")})
            elif name == "_extract_router" and isinstance(node.args[1], ast.Constant):
                found.append({node.args[1].value})
    return [alts for alts in found if any(m.split(".")[0] in ROOTS for m in alts)]


def test_parser_sources_are_the_modules_the_extraction_imports():
    def module(rel: str) -> str:
        return rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")

    listed = {module(rel): component for component, rels in ex.PARSER_SOURCES.items() for rel in rels}
    imports = _imports()
    named = set().union(*imports)
    assert {"vllm.engine.arg_utils", "sglang.srt.server_args", "sglang_router.router_args"} <= named  # the scan sees them
    for alternatives in imports:
        assert alternatives & set(listed), f"extract_flagsets.py imports {max(alternatives, key=len)}, which PARSER_SOURCES lacks"
    for mod, component in listed.items():
        assert mod in named, f"PARSER_SOURCES[{component!r}] lists {mod}, which the extraction does not import"
        assert ROOTS[mod.split(".")[0]] == component, (mod, component)


@pytest.fixture(scope="module")
def pinned_wheels(tmp_path_factory) -> dict[str, Path]:
    """The pinned wheels, downloaded from PyPI by pip (no dependencies)."""
    out = tmp_path_factory.mktemp("wheels")
    specs = [f"{ex.DISTRIBUTIONS[c]}=={v}" for c, v in sorted(ex.PINS.items())]
    run = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *WHEEL_TAGS,
                          "--dest", str(out), *specs], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, f"pip download {' '.join(specs)} failed:\n{run.stderr[-2000:]}"
    wheels = {}
    for component, version in ex.PINS.items():
        prefix = f"{ex.DISTRIBUTIONS[component].replace('-', '_')}-{version}-"
        (wheels[component],) = [w for w in out.glob("*.whl") if w.name.startswith(prefix)]
    return wheels


@pytest.mark.network
@pytest.mark.parametrize("component", sorted(ex.PINS))
def test_the_snapshot_was_extracted_from_the_pinned_wheel(component, pinned_wheels):
    entry = MANIFEST[component]
    with zipfile.ZipFile(pinned_wheels[component]) as wheel:
        members = set(wheel.namelist())
        actual = {rel: hashlib.sha256(wheel.read(rel)).hexdigest() if rel in members else "(not in the wheel)"
                  for rel in entry["sources"]}
    differ = {rel: (sha, actual[rel]) for rel, sha in entry["sources"].items() if actual[rel] != sha}
    assert not differ, (f"{component} {entry['version']} was not extracted from {pinned_wheels[component].name} "
                        f"(recorded, in the wheel): {differ}; " + FIX.format(c=component))
