"""One adapter per engine; each knows the flags of its pinned version."""

from ...api.models import PDInferenceService
from .base import EngineAdapter
from .sglang import SGLangAdapter
from .vllm import VLLMAdapter

ADAPTERS: dict[str, type[EngineAdapter]] = {"vllm": VLLMAdapter, "sglang": SGLangAdapter}


def engine_for(svc: PDInferenceService) -> EngineAdapter:
    return ADAPTERS[svc.spec.engine.kind](svc)


__all__ = ["ADAPTERS", "EngineAdapter", "SGLangAdapter", "VLLMAdapter", "engine_for"]
