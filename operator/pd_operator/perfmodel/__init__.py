"""The performance model of a GPU inference engine, fitted on measured H200
figures (``calibration/``, shipped in the package), pure.

The autoscaler uses it for per-replica capacity and the no-load latency floor
(:mod:`pd_operator.autoscale.capacity`); the engine simulator in the tools
package times its steps with it. :func:`calibration` returns the measurements
the fits were made on, so a test can check the model against them.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from .costmodel import CALIBRATED, LINKS, MODELS, CostModel, Efficiency, Link, ModelShape, shape_for

CALIBRATION_FILE = "h200-qwen3-8b-shape.json"

__all__ = ["CALIBRATED", "LINKS", "MODELS", "CostModel", "Efficiency", "Link", "ModelShape", "shape_for",
           "calibration"]


@lru_cache(maxsize=1)
def calibration() -> dict:
    """The raw H200 measurements (``calibration/h200-qwen3-8b-shape.json``)."""
    return json.loads(resources.files(__package__).joinpath("calibration", CALIBRATION_FILE).read_text())
