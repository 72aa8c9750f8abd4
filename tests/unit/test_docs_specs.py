"""Every PDInferenceService the docs show is one the API server accepts.

A user's first `kubectl apply` is usually a copy of a snippet: the one
`helm install` prints (the chart's NOTES.txt), the chart README's first
service, the README's. A snippet the CRD refuses (one once lacked
spec.router.image, which the CRD requires) fails that first apply. Each is
validated as `pdctl validate` does (the model carries the CRD's rules).
"""

from __future__ import annotations

import re

import pytest
import yaml

from pd_operator.api import SpecError, validate_service
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted(ROOT.glob("charts/*/README.md")), *sorted(ROOT.glob("operator/**/README.md")),
        *sorted(ROOT.glob("tests/**/README.md")), *sorted(ROOT.glob("e2e/**/*.md"))]
NOTES = sorted(ROOT.glob("charts/*/templates/NOTES.txt"))


def _untemplated(text: str) -> str:
    """NOTES.txt with its Helm actions taken out: `{{ if }}...{{ end }}` blocks dropped
    (they add the namespace when watchNamespaces is set), any other action removed."""
    text = re.sub(r"\{\{-? *if .*?\{\{-? *end *-?\}\}", "", text, flags=re.S)
    return re.sub(r"\{\{.*?\}\}", "", text, flags=re.S)


def snippets() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, block in enumerate(re.findall(r"```[a-z]*\n(.*?)```", doc.read_text(), flags=re.S)):
            if re.search(r"^kind: PDInferenceService\s*$", block, flags=re.M):
                out.append((f"{doc.relative_to(ROOT)}#{i}", block))
    for notes in NOTES:
        for i, block in enumerate(re.findall(r"<<'YAML'[^\n]*\n(.*?)\nYAML\n", _untemplated(notes.read_text()), flags=re.S)):
            out.append((f"{notes.relative_to(ROOT)}#{i}", block))
    return out


def test_the_docs_show_services():
    where = {name.split("#")[0] for name, _ in snippets()}
    assert {"README.md", "charts/pd-operator/README.md", "charts/pd-operator/templates/NOTES.txt"} <= where, where


@pytest.mark.parametrize("name,block", snippets(), ids=[n for n, _ in snippets()])
def test_a_service_in_the_docs_is_accepted(name, block):
    docs = [d for d in yaml.safe_load_all(block) if isinstance(d, dict) and d.get("kind") == "PDInferenceService"]
    assert docs, name
    for doc in docs:
        doc.setdefault("metadata", {}).setdefault("namespace", "default")
        try:
            validate_service(doc)
        except SpecError as err:
            pytest.fail(f"{name}: {err}")
