"""pd-operator: prefill/decode-disaggregated LLM inference on Kubernetes.

Never make ``operator/`` itself a package: it would shadow Python's standard
``operator`` module. The importable package is ``pd_operator``.
"""

__version__ = "0.1.0"
