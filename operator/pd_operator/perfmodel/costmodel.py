"""Step-time cost model of a GPU inference engine, from measured H200 figures.

PURE: no I/O, no clock, no randomness.  Every time is in **milliseconds**.

Calibration (``calibration/h200-qwen3-8b-shape.json`` beside this file; one H200,
Qwen3-8B shape, plain PyTorch + CUDA graphs, batch-1 prefill)::

    prefill(T)      = 3.20 + 0.0270*T + 8.44e-7*T^2                      (fit within 15%)
    decode_step(B)  = 5.81 + 0.0173*B + 60.75e-6 * B*(ctx+1)             (fit within 8%)

Generalisations used by the scheduler (they reduce exactly to the fits above):

* decode over sequences with different contexts: ``a + b*B + c*sum(ctx_i+1)``;
* chunked prefill of ``n`` tokens after ``p`` already computed tokens of the
  same prompt: ``b_p*n + c_p*((p+n)^2 - p^2)`` (the chunks of one prompt add
  up to the batch-1 fit), plus one fixed cost ``a_p`` per step;
* a *mixed* step (aggregated engine: decodes and prefill chunks in one
  forward): the weights are streamed once, so the step costs the decode step
  plus the prefill chunks' token terms (without a second fixed cost).  Every
  running decode waits for the whole step: this is how prefills interrupt
  decodes and inflate ITL on a non-disaggregated engine.

Shape and tensor-parallel scaling (first order, ``calibration/README.md``):

* decode fixed term ``a`` ~ weight bytes / TP;
* decode KV term ``c`` ~ KV bytes per token / TP;
* prefill linear term ~ 2*params / TP, quadratic (attention) term ~
  layers*n_q*head_dim / TP, prefill fixed term ~ weight bytes / TP;
* the per-sequence term ``b`` is kept (sampling/bookkeeping; not shape-bound).
  No TP communication cost is modelled.

Engine efficiency (explicit parameter, :class:`Efficiency`): the calibration is
plain PyTorch; a fused serving engine (vLLM, SGLang) is faster in decode:
about 4.0 ms instead of 5.81 ms fixed and 39 ns instead of 60.75 ns per cached
token (cuDNN attention reached ~80% of HBM bandwidth on the same shapes).
``Efficiency.pytorch()`` reproduces the measured points; ``Efficiency.fused()``
is the default for simulated engines.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = [
    "CALIBRATED",
    "Efficiency",
    "ModelShape",
    "MODELS",
    "CostModel",
    "Link",
    "LINKS",
    "shape_for",
]


@dataclass(frozen=True)
class ModelShape:
    """A decoder's shape; enough to scale the calibrated costs."""

    name: str
    params: float  # total parameters
    layers: int
    hidden: int
    n_q: int
    n_kv: int
    head_dim: int
    dtype_bytes: int = 2
    max_model_len: int = 40960

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, every layer, every KV head
        return self.layers * self.n_kv * self.head_dim * 2 * self.dtype_bytes

    @property
    def attn_width(self) -> int:
        return self.layers * self.n_q * self.head_dim


# The calibrated shape (measured: 8.19 B params streamed as 15.14 GB, 147456 B KV/token).
CALIBRATED = ModelShape("Qwen/Qwen3-8B", params=15_136_811_008 / 2, layers=36, hidden=4096,
                        n_q=32, n_kv=8, head_dim=128, max_model_len=40960)

# Approximate public shapes (config.json figures, rounded parameter counts).
MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen3-8B": CALIBRATED,
    "Qwen/Qwen3-32B": ModelShape("Qwen/Qwen3-32B", params=32.8e9, layers=64, hidden=5120,
                                 n_q=64, n_kv=8, head_dim=128, max_model_len=40960),
    "meta-llama/Llama-3.1-8B-Instruct": ModelShape("meta-llama/Llama-3.1-8B-Instruct", params=8.03e9,
                                                   layers=32, hidden=4096, n_q=32, n_kv=8, head_dim=128,
                                                   max_model_len=131072),
    "meta-llama/Llama-3.1-70B-Instruct": ModelShape("meta-llama/Llama-3.1-70B-Instruct", params=70.6e9,
                                                    layers=80, hidden=8192, n_q=64, n_kv=8, head_dim=128,
                                                    max_model_len=131072),
}
for _base in ("meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"):
    MODELS[_base] = replace(MODELS[_base + "-Instruct"], name=_base)
MODELS["Qwen/Qwen3-8B-FP8"] = replace(CALIBRATED, name="Qwen/Qwen3-8B-FP8")  # not scaled for FP8: same as bf16


def shape_for(model: str) -> ModelShape:
    """The shape of a known model name (exact, or by its last path component,
    case-insensitive); KeyError naming the known ones otherwise."""
    if model in MODELS:
        return MODELS[model]
    tail = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for name, shape in MODELS.items():
        if name.rsplit("/", 1)[-1].lower() == tail:
            return shape
    raise KeyError(f"unknown model {model!r}: the simulator knows {', '.join(sorted(MODELS))}")


@dataclass(frozen=True)
class Efficiency:
    """Engine efficiency relative to the calibration (Qwen3-8B shape, TP 1)."""

    decode_fixed_ms: float = 4.0  # per decode step (calibrated plain PyTorch: 5.81)
    decode_per_seq_ms: float = 0.0173
    decode_kv_ms_per_token: float = 39e-6  # per cached token read (PyTorch: 60.75e-6)
    prefill_fixed_ms: float = 3.20
    prefill_ms_per_token: float = 0.0270
    prefill_ms_per_token2: float = 8.44e-7

    @classmethod
    def pytorch(cls) -> "Efficiency":
        """The measured plain-PyTorch figures (reproduces the calibration points)."""
        return cls(decode_fixed_ms=5.81, decode_kv_ms_per_token=60.75e-6)

    @classmethod
    def fused(cls) -> "Efficiency":
        """A fused serving engine (vLLM/SGLang): ~4 ms fixed, ~39 ns per cached token."""
        return cls()

    @classmethod
    def named(cls, name: str) -> "Efficiency":
        if name == "pytorch":
            return cls.pytorch()
        if name == "fused":
            return cls.fused()
        raise ValueError(f"unknown efficiency {name!r} (pytorch|fused)")


@dataclass(frozen=True)
class Link:
    """A KV-transfer path: bandwidth plus a fixed cost per transfer."""

    name: str
    gbytes_per_s: float
    fixed_ms: float

    def transfer_ms(self, nbytes: float) -> float:
        return self.fixed_ms + nbytes / (self.gbytes_per_s * 1e9) * 1e3


LINKS = {
    # not measured: one 400 Gb/s NIC ~ 50 GB/s, plus handshake/registration per transfer
    "rdma": Link("rdma", 50.0, 1.0),
    # measured cuda:0 -> cuda:1: 385 GB/s contiguous; as 36 per-layer copies ~15 us more each
    # (225 GB/s effective for 2000 tokens of the calibrated shape)
    "nvlink": Link("nvlink", 385.0, 0.54),
    # measured pinned host staging, pipelined: ~49 GB/s
    "pcie": Link("pcie", 49.0, 0.5),
}


# usable HBM per H200 for weights + KV: 900886 tokens * 147456 B free after 15.14 GB of weights
H200_USABLE_BYTES = 900_886 * 147_456 + CALIBRATED.weight_bytes


@dataclass(frozen=True)
class CostModel:
    shape: ModelShape = CALIBRATED
    tp: int = 1
    eff: Efficiency = field(default_factory=Efficiency)
    gpu_usable_bytes: float = H200_USABLE_BYTES

    # ---- scale factors --------------------------------------------------
    @property
    def _w(self) -> float:
        return self.shape.weight_bytes / CALIBRATED.weight_bytes / self.tp

    @property
    def _kv(self) -> float:
        return self.shape.kv_bytes_per_token / CALIBRATED.kv_bytes_per_token / self.tp

    @property
    def _flops(self) -> float:
        return self.shape.params / CALIBRATED.params / self.tp

    @property
    def _attn(self) -> float:
        return self.shape.attn_width / CALIBRATED.attn_width / self.tp

    # ---- step costs (ms) ------------------------------------------------
    def decode_fixed_ms(self) -> float:
        return self.eff.decode_fixed_ms * self._w

    def decode_ms(self, batch: int, ctx_sum_plus: float) -> float:
        """One decode step of ``batch`` sequences; ``ctx_sum_plus`` = sum(ctx_i + 1)."""
        if batch <= 0:
            return 0.0
        return (self.decode_fixed_ms() + self.eff.decode_per_seq_ms * batch
                + self.eff.decode_kv_ms_per_token * self._kv * ctx_sum_plus)

    def decode_uniform_ms(self, batch: int, ctx: int) -> float:
        return self.decode_ms(batch, batch * (ctx + 1))

    def prefill_fixed_ms(self) -> float:
        return self.eff.prefill_fixed_ms * self._w

    def prefill_chunk_ms(self, done: int, n: int) -> float:
        """Token terms of computing ``n`` prompt tokens after ``done`` cached ones (no fixed cost)."""
        return (self.eff.prefill_ms_per_token * self._flops * n
                + self.eff.prefill_ms_per_token2 * self._attn * ((done + n) ** 2 - done ** 2))

    def prefill_ms(self, tokens: int) -> float:
        """Batch-1 prefill of a whole prompt."""
        return self.prefill_fixed_ms() + self.prefill_chunk_ms(0, tokens)

    def step_ms(self, decode_batch: int, ctx_sum_plus: float, chunks: list[tuple[int, int]]) -> float:
        """One scheduler step: ``decode_batch`` decodes plus prefill ``chunks`` [(done, n)].

        Decode-only: the decode fit.  Prefill-only: one prefill fixed cost plus the
        chunk terms.  Mixed: the decode step plus the chunk terms (weights read once).
        """
        extra = sum(self.prefill_chunk_ms(d, n) for d, n in chunks)
        if decode_batch > 0:
            return self.decode_ms(decode_batch, ctx_sum_plus) + extra
        if chunks:
            return self.prefill_fixed_ms() + extra
        return 0.0

    # ---- memory and transfer ---------------------------------------------
    def kv_bytes(self, tokens: int) -> float:
        return tokens * self.shape.kv_bytes_per_token

    def kv_capacity_tokens(self, mem_fraction: float = 1.0) -> int:
        """KV tokens that fit on the TP group after the weights (~900k for the 8B shape, TP 1)."""
        free = self.tp * self.gpu_usable_bytes * mem_fraction - self.shape.weight_bytes
        return max(0, int(free // self.shape.kv_bytes_per_token))

    def transfer_ms(self, tokens: int, link: Link) -> float:
        """KV of ``tokens`` moved prefill -> decode (all TP ranks in parallel)."""
        return link.transfer_ms(self.kv_bytes(tokens) / self.tp)
