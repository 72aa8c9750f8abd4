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

Mixture-of-experts shapes (DeepSeek-V3; NOT measured here: first order, checked
against published figures, ``calibration/README.md`` "MoE"):

* memory counts every parameter (``params``, at ``dtype_bytes``: FP8 = 1);
* compute counts the parameters one token activates (``active_params``): the
  prefill linear term and, in decode, a per-token GEMM term
  (``prefill_ms_per_token`` x active/calibrated params per sequence of the
  rank's batch: a 37B-active decode batch of 256 is GEMM-bound, not
  weight-bound);
* MLA KV cache per token = layers x (kv_lora_rank + qk_rope_head_dim) x KV
  dtype bytes, one latent shared by all heads: not split by attention TP, so
  sequences are spread over attention-DP ranks instead (``dp``); decode
  attention over the latent is charged by FLOPs (all heads read the same
  latent: ~240 FLOP per byte, compute-bound), at the calibration's attention
  rate;
* weights streamed per decode step per GPU = the non-expert part
  (attention, dense layers, shared experts, embeddings) / attention TP
  (``tp // dp``: 1 with full DP attention) + routed experts / the GPUs they are
  spread over (EP: ``tp``; SGLang ep_size x moe_tp = tp);
* expert parallelism costs one DeepEP dispatch per MoE layer per decode step
  (``ep_dispatch_ms_per_layer``, published), not overlapped;
* the engine's batch is spread over the ``dp`` attention ranks (balanced).

Dense shapes (``expert_params == 0``, ``dp == 1``) take none of these terms:
their results are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

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
    # --- mixture of experts (0 / None: a dense model) ---
    active_params: float | None = None  # parameters one token runs through (compute); None: params
    expert_params: float = 0.0  # routed-expert parameters (spread over the EP group)
    moe_layers: int = 0  # layers with routed experts (one EP dispatch each per step)
    # --- multi-head latent attention (0: K/V heads as above) ---
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    kv_dtype_bytes: int | None = None  # KV-cache element size; None: dtype_bytes

    @property
    def moe(self) -> bool:
        return self.expert_params > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def compute_params(self) -> float:
        return self.params if self.active_params is None else self.active_params

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        kv_dtype = self.kv_dtype_bytes or self.dtype_bytes
        if self.mla:
            # one compressed latent (kv_lora_rank) + the shared RoPE key per layer
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype
        # K and V, every layer, every KV head
        return self.layers * self.n_kv * self.head_dim * 2 * kv_dtype

    def kv_replicas(self, tp: int) -> int:
        """Copies of each KV head over ``tp`` GPUs: the engines split the KV heads over TP and
        give each GPU at least one, so past the head count they are replicated
        (``get_num_kv_heads``, max(1, heads // tp): vLLM 0.33.0 config/model.py, SGLang 0.5.23
        configs/model_config.py). An MLA latent is whole on every GPU: 1 here, counted per GPU."""
        return 1 if self.mla else max(1, tp // max(self.n_kv, 1))

    def kv_bytes_per_gpu_token(self, tp: int) -> float:
        """KV bytes one token takes on each GPU of a TP group: its share of the KV heads, at
        least one head (:meth:`kv_replicas`); an MLA latent whole."""
        if self.mla:
            return self.kv_bytes_per_token
        return self.kv_bytes_per_token * self.kv_replicas(tp) / tp

    @property
    def attn_width(self) -> int:
        return self.layers * self.n_q * self.head_dim

    @property
    def mla_decode_width(self) -> int:
        """Per cached token: layers x heads x (QK over latent+rope, PV over latent) dims
        (absorbed MLA decode); comparable to 2 x ``attn_width`` of a dense shape."""
        return self.layers * self.n_q * (2 * self.kv_lora_rank + self.qk_rope_head_dim)


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

# DeepSeek-V3 (MoE + MLA), from its config.json: hidden_size 7168, num_hidden_layers 61
# (first_k_dense_replace 3: 58 MoE layers), num_attention_heads 128, qk_nope_head_dim 128,
# qk_rope_head_dim 64, v_head_dim 128, kv_lora_rank 512, n_routed_experts 256 of
# moe_intermediate_size 2048 (gate/up/down: 3 x 7168 x 2048 each), num_experts_per_tok 8,
# n_shared_experts 1, max_position_embeddings 163840; 671B parameters in total, 37B active
# per token (DeepSeek-V3 technical report); weights FP8 (1 byte), KV cache bf16 (SGLang's
# --kv-cache-dtype auto: the activation dtype).
# Routed experts: 58 x 256 x 3 x 7168 x 2048 = 653.9B; everything else (attention,
# 3 dense layers, shared experts, embeddings) ~17B, the part every DP-attention GPU holds.
# head_dim 160: mean of the prefill (MHA form) QK dim 192 and V dim 128.
_DSV3_EXPERTS = 58 * 256 * 3 * 7168 * 2048
DEEPSEEK_V3 = ModelShape("deepseek-ai/DeepSeek-V3", params=671e9, layers=61, hidden=7168, n_q=128, n_kv=128,
                         head_dim=160, dtype_bytes=1, max_model_len=163840,
                         active_params=37e9, expert_params=_DSV3_EXPERTS, moe_layers=58,
                         kv_lora_rank=512, qk_rope_head_dim=64, kv_dtype_bytes=2)
MODELS[DEEPSEEK_V3.name] = DEEPSEEK_V3
for _name in ("deepseek-ai/DeepSeek-R1", "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1-0528"):
    MODELS[_name] = replace(DEEPSEEK_V3, name=_name)  # the same architecture and config figures


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
    # NOT measured here: one DeepEP low-latency dispatch per MoE layer per decode step,
    # ~0.17 ms on H100 in both DeepSeek's profile and SGLang's (LMSYS blog "Deploying
    # DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100 GPUs",
    # May 2025, "Dispatch Optimization Potential"); only MoE shapes with EP pay it.
    ep_dispatch_ms_per_layer: float = 0.17

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
    """Step costs of one engine replica.

    ``tp``: the engine's tensor-parallel size (SGLang ``--tp-size``: every GPU of
    the replica). ``dp``: attention data-parallel ranks inside it (SGLang
    ``--attn-dp-size``; attention TP = tp / dp): the batch is spread over them.
    ``ep``: expert parallelism on (>1) for an MoE shape. ``hbm_ratio``: HBM
    bandwidth relative to the calibration GPU's (H200 1.0; H100 SXM 3.35/4.8):
    weight and KV reads scale with it, FLOPs do not (same Hopper compute).
    """

    shape: ModelShape = CALIBRATED
    tp: int = 1
    eff: Efficiency = field(default_factory=Efficiency)
    gpu_usable_bytes: float = H200_USABLE_BYTES
    dp: int = 1
    ep: int = 1
    hbm_ratio: float = 1.0

    # ---- layout ---------------------------------------------------------
    @property
    def attn_tp(self) -> int:
        return max(1, self.tp // max(1, self.dp))

    def weight_bytes_per_gpu(self) -> float:
        """Weights each GPU holds and streams per decode step."""
        s = self.shape
        if not s.moe and self.dp == 1:
            return s.weight_bytes / self.tp
        dense = s.weight_bytes - s.expert_bytes
        # experts: spread over the EP group (SGLang ep_size x moe_tp = tp) or TP-sharded: tp either way
        return dense / self.attn_tp + s.expert_bytes / self.tp

    # ---- scale factors --------------------------------------------------
    @property
    def _w(self) -> float:
        if not self.shape.moe and self.dp == 1:
            return self.shape.weight_bytes / CALIBRATED.weight_bytes / self.tp / self.hbm_ratio
        return self.weight_bytes_per_gpu() / CALIBRATED.weight_bytes / self.hbm_ratio

    @property
    def _kv(self) -> float:
        if self.shape.mla:
            # the latent is not split by attention TP; charged by FLOPs (compute-bound) or
            # bytes, whichever is slower; per attention rank (the batch is spread over dp)
            flops = self.shape.mla_decode_width / (2 * CALIBRATED.attn_width)
            nbytes = self.shape.kv_bytes_per_token / CALIBRATED.kv_bytes_per_token / self.hbm_ratio
            return max(flops * self._attn_rate, nbytes) / self.dp
        # each GPU reads its share of the KV heads, at least one head (ModelShape.kv_replicas)
        return (self.shape.kv_bytes_per_token * self.shape.kv_replicas(self.tp) / CALIBRATED.kv_bytes_per_token
                / self.tp / self.hbm_ratio)

    @property
    def _attn_rate(self) -> float:
        """Decode attention FLOPs, in cached-token reads of the calibrated shape: the
        calibrated prefill's attention rate (c_p per T^2) over its decode KV cost per token."""
        return self.eff.prefill_ms_per_token2 * 2 / self.eff.decode_kv_ms_per_token

    @property
    def _flops(self) -> float:
        if self.shape.moe or self.dp > 1:
            return self.shape.compute_params / CALIBRATED.params / self.attn_tp / self.dp
        return self.shape.params / CALIBRATED.params / self.tp

    @property
    def _attn(self) -> float:
        if self.shape.moe or self.dp > 1:
            return self.shape.attn_width / CALIBRATED.attn_width / self.attn_tp / self.dp
        return self.shape.attn_width / CALIBRATED.attn_width / self.tp

    def _per_seq_ms(self, batch: float) -> float:
        if self.shape.moe:
            # every token of the rank's batch runs the active parameters' GEMMs
            per_token = self.eff.prefill_ms_per_token * self.shape.compute_params / CALIBRATED.params / self.attn_tp
            return max(self.eff.decode_per_seq_ms, per_token) * batch / self.dp
        return self.eff.decode_per_seq_ms * batch / self.dp

    def _ep_ms(self) -> float:
        return self.eff.ep_dispatch_ms_per_layer * self.shape.moe_layers if (self.shape.moe and self.ep > 1) else 0.0

    # ---- step costs (ms) ------------------------------------------------
    def decode_fixed_ms(self) -> float:
        return self.eff.decode_fixed_ms * self._w + self._ep_ms()

    def decode_ms(self, batch: int, ctx_sum_plus: float) -> float:
        """One decode step of ``batch`` sequences; ``ctx_sum_plus`` = sum(ctx_i + 1)."""
        if batch <= 0:
            return 0.0
        return (self.decode_fixed_ms() + self._per_seq_ms(batch)
                + self.eff.decode_kv_ms_per_token * self._kv * ctx_sum_plus)

    def scaled(self, factor: float) -> "CostModel":
        """This model with every step-time term multiplied by ``factor`` (0.8: engines 20 %
        faster than calibrated); memory and transfers unchanged."""
        if factor == 1.0:
            return self
        eff = replace(self.eff, **{f.name: getattr(self.eff, f.name) * factor for f in fields(self.eff)})
        return replace(self, eff=eff)

    def decode_uniform_ms(self, batch: int, ctx: int) -> float:
        return self.decode_ms(batch, batch * (ctx + 1))

    def prefill_fixed_ms(self) -> float:
        return self.eff.prefill_fixed_ms * self._w

    def prefill_chunk_ms(self, done: int, n: int) -> float:
        """Token terms of computing ``n`` prompt tokens after ``done`` cached ones (no fixed cost).
        With attention DP the tokens of a step are spread over the ``dp`` ranks (throughput;
        one lone prompt is not split in an engine, so its latency is optimistic here)."""
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

    def kv_capacity_tokens(self, mem_fraction: float = 1.0, kv_bytes_per_gpu: float | None = None) -> int:
        """KV tokens that fit on the TP group after the weights (~900k for the 8B shape, TP 1);
        with ``kv_bytes_per_gpu``, in that much KV memory on each GPU instead."""
        if self.shape.mla or self.shape.moe or self.dp > 1:
            # per attention rank: its GPUs' memory after their weights; an MLA latent is
            # replicated over the rank's attention TP, so the rank holds one copy per GPU
            free_gpu = (self.gpu_usable_bytes * mem_fraction - self.weight_bytes_per_gpu()
                        if kv_bytes_per_gpu is None else kv_bytes_per_gpu)
            per_rank = free_gpu * (1 if self.shape.mla else self.attn_tp)
            return max(0, int(self.dp * per_rank // (self.shape.kv_bytes_per_token * self.shape.kv_replicas(self.attn_tp))))
        free = (self.tp * self.gpu_usable_bytes * mem_fraction - self.shape.weight_bytes
                if kv_bytes_per_gpu is None else self.tp * kv_bytes_per_gpu)
        return max(0, int(free // (self.shape.kv_bytes_per_token * self.shape.kv_replicas(self.tp))))

    def transfer_ms(self, tokens: int, link: Link) -> float:
        """KV of ``tokens`` moved prefill -> decode (all TP ranks in parallel, each its share of
        the KV heads, at least one: ModelShape.kv_replicas; an MLA latent lives whole on one attention
        rank: one rank's link carries it)."""
        if self.shape.mla:
            return link.transfer_ms(self.kv_bytes(tokens))
        return link.transfer_ms(self.kv_bytes(tokens) * self.shape.kv_replicas(self.tp) / self.tp)
