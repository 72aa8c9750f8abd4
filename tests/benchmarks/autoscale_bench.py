"""Run the autoscaling-quality benchmark (not a test: pytest does not collect it).

    .venv/bin/python tests/benchmarks/autoscale_bench.py              # the reference day -> tests/benchmarks/results/
    .venv/bin/python tests/benchmarks/autoscale_bench.py --hours 0.5 --start-hour 19.9 --rate-scale 0.25 --out /tmp/x

Same as ``pdctl autoscale-bench``; see tests/benchmarks/README.md.
"""

from __future__ import annotations

import os
import sys

from pd_operator.cli import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")]
    sys.exit(main(["autoscale-bench", *args]))
