"""The PDInferenceService data model: spec, status, defaults and validation.

It is the single source of truth: the CRD schema (``crds/``) is generated from
these models, and the same cross-field rules run here (``pdctl``, offline) and
in the API server (CEL, online) with the same messages.
"""

from .constants import API_VERSION, GROUP, KIND, PLURAL, VERSION
from .errors import SpecError, validate_service
from .models import PDInferenceService, PDInferenceServiceSpec, PDInferenceServiceStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "PDInferenceService",
    "PDInferenceServiceSpec",
    "PDInferenceServiceStatus",
    "SpecError",
    "validate_service",
]
