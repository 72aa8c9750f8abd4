"""Regenerate tests/golden/ from manifests/examples/ (review the diff!)."""

from pd_operator.api import validate_service
from pd_operator.cli import to_yaml
from pd_operator.render import render
from tests.conftest import EXAMPLES, ROOT, load_example

if __name__ == "__main__":
    out = ROOT / "tests" / "golden"
    out.mkdir(exist_ok=True)
    for path in EXAMPLES:
        (out / f"{path.stem}.yaml").write_text(to_yaml(render(validate_service(load_example(path)))))
        print(f"wrote {out / path.stem}.yaml")
