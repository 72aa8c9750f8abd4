"""Every image a user gets is one they can pull or one they are told to build.

No router image with the pinned routers' Python launcher is published
(tests/contract/FACTS.md, "Images"), so spec.router.image is required and the
error carries the recipe. The operator image's recipe (operator/Dockerfile) is
checked as far as a machine without Docker allows: the wheel it builds, the
constraints it pins, the module its ENTRYPOINT runs."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.api.constants import ENGINE_IMAGES, ROUTER_VERSIONS
from tests.conftest import minimal

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "operator" / "Dockerfile"
ROUTER_DOCKERFILE = ROOT / "operator" / "images" / "router.Dockerfile"


def _strip_router(obj: dict) -> dict:
    obj["spec"].pop("router", None)
    return obj


@pytest.mark.parametrize("engine,router", [("vllm", "vllm-router"), ("sglang", "sglang-router")])
def test_a_service_without_router_image_is_refused_with_the_build_recipe(engine, router):
    with pytest.raises(SpecError) as info:
        validate_service(_strip_router(minimal(engine)))
    msg = dict(info.value.problems)["spec.router.image"]
    version = ROUTER_VERSIONS[router]
    assert "operator/images/router.Dockerfile" in msg
    assert f"--build-arg ROUTER={router} --build-arg VERSION={version}" in msg
    assert "router.image" in msg


def test_the_router_recipe_installs_the_package_the_render_launches():
    """The Dockerfile the error names installs ROUTER==VERSION, and its build args are the ones the error passes."""
    text = ROUTER_DOCKERFILE.read_text()
    assert re.search(r'^ARG ROUTER=', text, re.M) and re.search(r'^ARG VERSION=', text, re.M)
    assert re.search(r'pip install [^\n]*"\$\{ROUTER\}==\$\{VERSION\}"', text)


def test_engine_images_are_the_engines_official_repositories():
    # vLLM publishes vllm/vllm-openai, SGLang lmsysorg/sglang (FACTS.md, "Images")
    assert ENGINE_IMAGES["vllm"].startswith("docker.io/vllm/vllm-openai:v")
    assert ENGINE_IMAGES["sglang"].startswith("docker.io/lmsysorg/sglang:v")


# --------------------------------------------------------------------------- operator image


def _dockerfile_pins() -> dict[str, str]:
    text = DOCKERFILE.read_text()
    body = re.search(r"<<'PINS' /etc/pd-operator/constraints.txt\n(.*?)\nPINS\n", text, re.S)
    assert body, "operator/Dockerfile has no constraints heredoc"
    pins = {}
    for line in body.group(1).splitlines():
        name, _, version = line.partition("==")
        pins[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return pins


def _runtime_requirements() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        name, _, version = dep.partition("==")
        assert version, f"runtime dependency {dep!r} is not pinned with =="
        out[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return out


def test_dockerfile_constraints_pin_every_runtime_dependency_at_the_pyproject_version():
    pins, reqs = _dockerfile_pins(), _runtime_requirements()
    assert {k: pins.get(k) for k in reqs} == reqs


def test_dockerfile_constraints_match_the_installed_runtime_closure():
    """Each transitive pin is the version the tests run with (a stale pin would install an untested set)."""
    from importlib.metadata import PackageNotFoundError, version

    stale = {}
    for name, pinned in _dockerfile_pins().items():
        try:
            have = version(name)
        except PackageNotFoundError:
            continue
        if have != pinned:
            stale[name] = (pinned, have)
    assert stale == {}


def test_dockerfile_copies_what_the_wheel_build_needs():
    text = DOCKERFILE.read_text()
    copied = set()
    for m in re.finditer(r"^COPY (?!--from)(?!<<)(.+?) (\S+)$", text, re.M):
        copied.update(m.group(1).split())
    assert {"pyproject.toml", "README.md", "operator/pd_operator"} <= copied
    # package data the runtime reads lives under operator/pd_operator, which is copied whole
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert all(pkg.startswith("pd_operator") for pkg in data)


@pytest.fixture(scope="module")
def image_wheel(tmp_path_factory) -> Path:
    """The wheel the Dockerfile's build stage makes, from the same files it copies."""
    src = tmp_path_factory.mktemp("ctx")
    import shutil

    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "operator" / "pd_operator", src / "operator" / "pd_operator",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(src)], check=True)
    (whl,) = out.glob("pd_operator-*.whl")
    return whl


def test_the_entrypoint_module_of_the_image_runs_from_the_wheel(image_wheel, tmp_path):
    """ENTRYPOINT ["python", "-m", "pd_operator"] on the wheel alone (not the source tree) answers --help."""
    text = DOCKERFILE.read_text()
    (entry,) = re.findall(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    argv = __import__("json").loads(entry)
    assert argv[:2] == ["python", "-m"]
    site = tmp_path / "site"
    zipfile.ZipFile(image_wheel).extractall(site)
    assert (site / argv[2].replace(".", "/") / "__main__.py").exists()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-I", "-c",
                          f"import sys; sys.path.insert(0, {str(site)!r}); import runpy; "
                          f"sys.argv=['{argv[2]}', '--help']; runpy.run_module('{argv[2]}', run_name='__main__')"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--all-namespaces" in out.stdout  # the image's CMD is a flag this entrypoint knows
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.M)
    for flag in __import__("json").loads(cmd):
        assert flag.split("=")[0] in out.stdout
