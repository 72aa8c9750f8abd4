"""``pdctl simulate``: try a policy edit against a trace before applying it.

``pdctl simulate -f current.yaml [--candidate edited.yaml]`` runs each
PDInferenceService's autoscaling policy -- the operator's own code path,
:func:`~pd_operator.autoscale.plan.plan_service`, with the spec's own
min/max, targets, tolerance, behaviour, secondary targets, capacity,
``maxTotalGPUs`` and interval -- on the same trace (synthetic ``--trace NAME``
or recorded ``--trace-file``), in the simulated PD fleet of the autoscaling
benchmark (:mod:`.fleet`: calibrated H200 cost model at each spec's model
shape and tensor-parallel size, pods Ready ``--start-delay`` after the order,
Prometheus' view: 15-s scrapes, 1-minute windows), and prints predicted
goodput, latency quantiles, GPU-hours and scaling actions, with the delta of
the candidate against the current spec.

Both runs are judged by the same yardstick: the **current** spec's targets
(request good when TTFT < prefill target and mean ITL < decode target), so a
candidate cannot look better by loosening its own targets.

What the simulation does not model: engines other than the cost model's
(SGLang runs as vLLM), GPUs other than H200, pipeline or data parallelism
(refused), prefix caching, KV transfer other than RDMA 50 GB/s + 1 ms,
scheduling failures (every pod gets a GPU), Prometheus outages.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace

import yaml

from pd_operator.api import SpecError, validate_service
from pd_operator.api.constants import ROLES
from pd_operator.api.models import PDInferenceService, duration_seconds
from pd_operator.autoscale.capacity import (CALIBRATED_GPU, CALIBRATED_MEMORY_FRACTION, pool_cost_model,
                                            pool_max_running, pool_shape, pool_step_tokens)
from pd_operator.render.args import flag_field, user_engine_flag
from pd_operator.perfmodel.costmodel import MODELS, CostModel, shape_for
from .policies import PdOperator
from .reference import SCRAPE, START_DELAY
from .runner import Result, run_policy
from .trace import TRACES, RecordedTrace, Trace, TraceError, load_trace


class SimulateError(Exception):
    """A problem with the command's input; ``code``: 2 unreadable, 1 invalid."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------- specs
def load_spec(path: str) -> PDInferenceService:
    """Read and validate one PDInferenceService, and check the simulator can run it."""
    try:
        with open(path, encoding="utf-8") as fh:
            docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    except (OSError, UnicodeDecodeError) as err:
        raise SimulateError(f"cannot read {path}: {err}", 2) from None
    except yaml.YAMLError as err:
        raise SimulateError(f"cannot read {path}: not YAML: {err}", 2) from None
    if len(docs) != 1:
        raise SimulateError(f"{path}: holds {len(docs)} documents; simulate takes one PDInferenceService per file", 2)
    try:
        svc = validate_service(docs[0])
    except SpecError as err:
        raise SimulateError(f"{path}: {err}", 1) from None
    problems = simulation_problems(svc)
    if problems:
        raise SimulateError(f"{path}: the simulator cannot run {svc.metadata.name!r}:\n"
                            + "\n".join(f"  {f}: {m}" for f, m in problems), 1)
    return svc


# flags of extraArgs that size the engine's KV cache (perfmodel.engine_defaults.kv_tokens); the
# simulated fleet sizes it from gpuMemoryUtilization only
KV_SIZE_FLAGS = {"vllm": ("--kv-cache-memory-bytes", "--num-gpu-blocks-override"), "sglang": ("--max-total-tokens",)}
# speculative decoding: tokens per step depend on the draft's acceptance, which the cost model
# does not know (enginesim refuses it too)
SPECULATIVE_FLAGS = {"vllm": "--speculative-config", "sglang": "--speculative-algorithm"}


def cost_model(svc: PDInferenceService, role: str) -> CostModel:
    """The pool's engine rank (its KV cache in the dtype of --kv-cache-dtype: pool_shape);
    simulation_problems has refused what it cannot model."""
    return pool_cost_model(pool_shape(svc.spec, role), svc.spec.engine.kind, svc.spec.pool(role))[0]


def simulation_problems(svc: PDInferenceService) -> list[tuple[str, str]]:
    """(field, message) for what the cost model cannot simulate; empty when it can."""
    spec = svc.spec
    try:
        shape_for(spec.model.name)
    except KeyError:
        return [("spec.model.name", f"the cost model does not know {spec.model.name!r}; it knows "
                                    f"{', '.join(sorted(MODELS))}")]
    out = []
    if spec.engine.accelerator != "nvidia":
        out.append(("spec.engine.accelerator", f"the cost model is calibrated on NVIDIA {CALIBRATED_GPU} only "
                                               f"(got {spec.engine.accelerator!r})"))
    for role in ROLES:
        pool, at = svc.spec.pool(role), f"spec.{role}"
        if pool_shape(spec, role) is None:
            dtype = user_engine_flag(spec, role, "--kv-cache-dtype")
            out.append((flag_field(spec, role, "--kv-cache-dtype"),
                        f"the cost model does not model the KV cache of --kv-cache-dtype {dtype!r} for this "
                        "model (it models the model's own dtype and the plain FP8 formats)"))
            continue
        for flag in KV_SIZE_FLAGS[spec.engine.kind]:
            if user_engine_flag(spec, role, flag) is not None:
                out.append((flag_field(spec, role, flag), f"the simulated fleet does not model a KV cache sized by {flag} (the autoscaler's "
                                   "capacity follows it): simulate a copy of the spec without it"))
        flag = SPECULATIVE_FLAGS[spec.engine.kind]
        if user_engine_flag(spec, role, flag) is not None:
            out.append((flag_field(spec, role, flag), f"the simulated fleet does not model speculative decoding ({flag}: the tokens a "
                               "step emits depend on the draft's acceptance): simulate a copy of the spec without it"))
        product = pool.gpu_product or pool.node_selector.get(spec.gpu_product_label())
        if product is not None and CALIBRATED_GPU not in product.upper():
            field = "gpuProduct" if pool.gpu_product else f"nodeSelector[{spec.gpu_product_label()}]"
            out.append((f"{at}.{field}", f"the cost model is calibrated on NVIDIA {CALIBRATED_GPU} only (got {product!r})"))
        if pool.pipeline_parallel_size != 1:
            out.append((f"{at}.pipelineParallelSize", "pipeline parallelism is not modelled: use 1"))
        if pool.data_parallel_size != 1:
            out.append((f"{at}.dataParallelSize", "the simulator runs one engine per replica: use 1"))
        if kv_capacity(svc, role) <= 0:
            out.append((f"{at}.tensorParallelSize", f"the weights of {spec.model.name} do not fit on "
                                                    f"{pool.tensor_parallel_size} {CALIBRATED_GPU}: raise it"))
        if not pool.autoscaling.enabled and pool.desired_replicas(None) < 1:
            out.append((f"{at}.replicas", "0 replicas and no autoscaling: nothing would serve the trace"))
    return out


def kv_capacity(svc: PDInferenceService, role: str) -> int:
    """KV tokens of one replica (at the pool's gpuMemoryUtilization, read as autoscale/capacity.py does)."""
    pool = svc.spec.pool(role)
    memory = min(1.0, (pool.gpu_memory_utilization or CALIBRATED_MEMORY_FRACTION) / CALIBRATED_MEMORY_FRACTION)
    return cost_model(svc, role).kv_capacity_tokens(memory)


def max_len(svc: PDInferenceService) -> int:
    return svc.spec.model.max_model_len or shape_for(svc.spec.model.name).max_model_len


def check_trace(svc: PDInferenceService, path: str, trace) -> None:
    """Every request of a recorded trace must fit the spec's engines (they would refuse it)."""
    if not isinstance(trace, RecordedTrace):
        return
    limit = min(max_len(svc), kv_capacity(svc, "prefill"), kv_capacity(svc, "decode"))
    for t, isl, osl, line in trace.requests:
        if isl + osl > limit:
            raise SimulateError(f"{trace.path}:{line}: isl + osl = {isl + osl} tokens exceed what one replica of "
                                f"{path} holds ({limit} tokens: max model length and KV cache)", 1)


def fleet_settings(svc: PDInferenceService, yardstick: PDInferenceService) -> dict:
    """:class:`~.fleet.BenchFleet` settings for ``svc``, judged by ``yardstick``'s targets."""
    limits, gpus = {}, {}
    for role in ROLES:
        pool = svc.spec.pool(role)
        limits[role] = (pool_max_running(svc.spec, role, cost_model(svc, role)), pool_step_tokens(svc.spec, role))
        gpus[role] = pool.gpus_per_replica()
    ttft, itl = slo(yardstick)
    return {"decode_cost": _with_memory(svc, "decode"), "limits": limits, "gpus_per_replica": gpus,
            "ttft_slo": ttft, "itl_slo": itl}


def _with_memory(svc: PDInferenceService, role: str) -> CostModel:
    pool = svc.spec.pool(role)
    cost = cost_model(svc, role)
    if pool.gpu_memory_utilization is None:
        return cost
    memory = min(1.0, pool.gpu_memory_utilization / CALIBRATED_MEMORY_FRACTION)
    return replace(cost, gpu_usable_bytes=cost.gpu_usable_bytes * memory)


def slo(svc: PDInferenceService) -> tuple[float, float]:
    """(TTFT, mean ITL) per request, seconds: the spec's prefill and decode target values."""
    return (duration_seconds(svc.spec.prefill.autoscaling.target.value),
            duration_seconds(svc.spec.decode.autoscaling.target.value))


def initial_sizes(svc: PDInferenceService, given: dict[str, int] | None = None) -> dict[str, int]:
    """Each pool starts Ready at the spec's starting size (replicas within min..max; min when unset),
    or at ``given[role]`` (within min..max for an autoscaled pool; a static pool keeps its replicas)."""
    out = {}
    for role in ROLES:
        pool = svc.spec.pool(role)
        n = pool.desired_replicas(None)
        if given and role in given and pool.autoscaling.enabled:
            n = pool.desired_replicas(given[role])
        out[role] = max(1, n)
    return out


# --------------------------------------------------------------------------- runs
@dataclass
class Run:
    label: str   # current / candidate
    path: str
    svc: PDInferenceService
    result: Result | None = None
    initial: dict | None = None  # role -> replicas the run starts with (Ready)


def simulate_one(run: Run, trace, yardstick: PDInferenceService, start_delay: float = START_DELAY,
                 initial: dict[str, int] | None = None) -> Result:
    svc = run.svc
    run.initial = initial_sizes(svc, initial)
    # capacity None: the operator's own per-replica estimate (plan_service), or the spec's capacityPerReplica
    policy = PdOperator(run.initial, None, svc=svc, name=run.label)
    return run_policy(trace, policy, cost=_with_memory(svc, "prefill"), start_delay=start_delay,
                      fleet_kw=fleet_settings(svc, yardstick))


_JOBS: list = []


def _job(i: int) -> Result:
    return simulate_one(*_JOBS[i])


def simulate(runs: list[Run], trace, start_delay: float = START_DELAY, jobs: int = 2,
             initial: dict[str, int] | None = None) -> list[Run]:
    """Every run's spec on ``trace``, judged by the first run's targets."""
    yardstick = runs[0].svc
    global _JOBS
    _JOBS = [(r, trace, yardstick, start_delay, initial) for r in runs]
    if jobs > 1 and len(runs) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(min(jobs, len(runs))) as pool:
            results = pool.map(_job, range(len(runs)))
    else:
        results = [_job(i) for i in range(len(runs))]
    _JOBS = []
    for r, res in zip(runs, results):
        r.result = res
        r.initial = initial_sizes(r.svc, initial)
    return runs


# --------------------------------------------------------------------------- report
FIGURES = ("goodput", "ttft_p99", "itl_p99", "gpu_hours", "goodput_per_gpu_hour", "actions")
TTFT_CAP = 200.0  # the client TTFT histogram's last bin (s)


def _row(r: Run) -> dict:
    res = r.result
    row = {"policy": r.label, "file": r.path, "name": r.svc.metadata.name}
    row.update({k: getattr(res, k) for k in FIGURES})
    row["ttft_p99_capped"] = res.ttft_p99 >= TTFT_CAP
    row["requests"] = res.requests
    row["initial_replicas"] = r.initial
    return row


def _delta(a: dict, b: dict) -> dict:
    out = {}
    for k in FIGURES:
        d = b[k] - a[k]
        out[k] = d
        if k in ("gpu_hours", "goodput_per_gpu_hour") and a[k]:
            out[k + "_pct"] = 100 * d / a[k]
    return out


def describe_trace(trace, name: str | None) -> str:
    if isinstance(trace, RecordedTrace):
        return f"recorded {trace.path} ({len(trace.requests)} requests over {trace.duration / 60:.0f} min)"
    h0 = trace.start_h % 24
    return (f"{name} ({trace.hours:g} h from {int(h0):02d}:{int(round(h0 % 1 * 60)) % 60:02d}, rates x{trace.rate_scale:g}"
            f"{f', speed {trace.speed:g}' if trace.speed != 1 else ''}, seed {trace.seed})")


def report(runs: list[Run], trace, trace_name: str | None, start_delay: float) -> dict:
    ttft, itl = slo(runs[0].svc)
    rows = [_row(r) for r in runs]
    out = {
        "trace": describe_trace(trace, trace_name),
        "requests": runs[0].result.requests,
        "start_delay_s": start_delay, "scrape_s": SCRAPE, "window_s": 60,
        "interval_s": {r.label: duration_seconds(r.svc.spec.autoscaling.interval) for r in runs},
        "slo": {"ttft_s": ttft, "mean_itl_s": itl, "from": runs[0].path,
                "note": "both runs are judged by the current spec's targets"},
        "results": rows,
    }
    if len(rows) > 1:
        out["delta"] = _delta(rows[0], rows[1])
    return out


def _ms(s: float) -> str:
    return f"{s * 1000:g}ms" if s < 1 else f"{s:g}s"


def format_text(rep: dict) -> str:
    rows = rep["results"]
    lines = [f"trace: {rep['trace']}",
             "start: " + "; ".join(f"{r['policy']} prefill {r['initial_replicas']['prefill']}, decode "
                                   f"{r['initial_replicas']['decode']} replicas" for r in rows)
             + f"; pods Ready {rep['start_delay_s']:g} s after a scale-up",
             "autoscaler every " + " / ".join(f"{v:g} s ({k})" for k, v in rep["interval_s"].items())
             + f"; metrics as Prometheus sees them ({rep['scrape_s']:g}-s scrapes, 1-min windows)",
             f"SLO per request (the current spec's targets, for both runs): TTFT < {_ms(rep['slo']['ttft_s'])} "
             f"and mean ITL < {_ms(rep['slo']['mean_itl_s'])}; goodput = share of the {rep['requests']} requests "
             f"meeting both",
             ""]
    head = ["policy", "goodput", "TTFT p99", "ITL p99", "GPU-hours", "good req/GPU-h", "scaling actions"]
    table = []
    for r in rows:
        ttft = (">=200 s" if r["ttft_p99_capped"] else f"{r['ttft_p99']:.3f} s")
        table.append([f"{r['policy']} ({r['file']})", f"{r['goodput']:.4f}", ttft, f"{r['itl_p99'] * 1e3:.1f} ms",
                      f"{r['gpu_hours']:.1f}", f"{r['goodput_per_gpu_hour']:.0f}", f"{r['actions']}"])
    if "delta" in rep:
        d = rep["delta"]
        capped = any(r["ttft_p99_capped"] for r in rows)
        table.append(["delta (candidate - current)", f"{d['goodput']:+.4f}",
                      "n/a" if capped else f"{d['ttft_p99']:+.3f} s", f"{d['itl_p99'] * 1e3:+.1f} ms",
                      f"{d['gpu_hours']:+.1f} ({d.get('gpu_hours_pct', math.nan):+.1f}%)",
                      f"{d['goodput_per_gpu_hour']:+.0f} ({d.get('goodput_per_gpu_hour_pct', math.nan):+.1f}%)",
                      f"{d['actions']:+d}"])
    widths = [max(len(x[i]) for x in [head] + table) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    lines.append(fmt(head))
    lines += [fmt(x) for x in table]
    return "\n".join(lines)


# --------------------------------------------------------------------------- command
def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="predict goodput and GPU-hours of a PDInferenceService's autoscaling policy (and an edited one) on a trace",
        description="Run the spec's autoscaling policy (the operator's own decision code) in a simulated fleet on a "
        "synthetic or recorded trace, in virtual time; with --candidate, the edited spec on the same trace, and the "
        "difference. Both are judged by the current spec's TTFT/ITL targets.")
    p.add_argument("-f", "--file", required=True, help="the current PDInferenceService (YAML)")
    p.add_argument("--candidate", help="the edited PDInferenceService to compare with the current one")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", choices=sorted(TRACES), help="synthetic trace (default: reference)")
    src.add_argument("--trace-file", help="recorded trace: CSV with a t,isl,osl header, or JSON Lines {t, isl, osl} "
                                         "(t: seconds from the start; tests/benchmarks/README.md)")
    p.add_argument("--hours", type=float, help="synthetic trace: simulate this many hours (default: 24)")
    p.add_argument("--start-hour", type=float, help="synthetic trace: hour of day the run starts at (default 0)")
    p.add_argument("--rate-scale", type=float, help="synthetic trace: multiply every rate")
    p.add_argument("--speed", type=float, help="synthetic trace: compress the day's shape by this factor")
    p.add_argument("--seed", type=int, help="synthetic trace: random seed")
    p.add_argument("--start-delay", type=float, default=START_DELAY,
                   help=f"seconds from a scale-up to the pod serving (schedule, image, weights; default {START_DELAY:g})")
    p.add_argument("--initial", metavar="PREFILL,DECODE",
                   help="replicas each autoscaled pool starts with, Ready, within its min..max (default: the spec's "
                   "replicas, else minReplicas)")
    p.add_argument("--jobs", type=int, default=2, help="specs simulated in parallel (processes; default 2)")
    p.add_argument("--png", help="write a timeline (rate, replicas per pool, SLO attainment per minute) to this PNG")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=main)


def build_trace(args):
    synthetic = {"hours": args.hours, "start_h": args.start_hour, "rate_scale": args.rate_scale,
                 "speed": args.speed, "seed": args.seed}
    if args.trace_file:
        given = [f"--{k.replace('_', '-').replace('start-h', 'start-hour')}" for k, v in synthetic.items() if v is not None]
        if given:
            raise SimulateError(f"{', '.join(given)}: for synthetic traces (--trace) only, not with --trace-file", 2)
        try:
            return load_trace(args.trace_file), None
        except OSError as err:
            raise SimulateError(f"cannot read {args.trace_file}: {err}", 2) from None
        except TraceError as err:
            raise SimulateError(str(err), 1) from None
    name = args.trace or "reference"
    for k, v in synthetic.items():
        if v is not None and k in ("hours", "rate_scale", "speed") and not v > 0:
            raise SimulateError(f"--{k.replace('_', '-')} must be > 0 (got {v:g})", 2)
    tr: Trace = replace(TRACES[name], **{k: v for k, v in synthetic.items() if v is not None})
    return tr, name


def parse_initial(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) != 2 or min(values) < 1:
        raise SimulateError(f"--initial takes PREFILL,DECODE replicas, two whole numbers >= 1 (got {text!r})", 2)
    return dict(zip(ROLES, values))


def main(args) -> int:
    try:
        runs = [Run("current", args.file, load_spec(args.file))]
        if args.candidate:
            runs.append(Run("candidate", args.candidate, load_spec(args.candidate)))
        trace, name = build_trace(args)
        for r in runs:
            check_trace(r.svc, r.path, trace)
        if args.start_delay < 0:
            raise SimulateError(f"--start-delay must be >= 0 (got {args.start_delay:g})", 2)
        initial = parse_initial(args.initial)
    except SimulateError as err:
        print(f"pdctl simulate: {err}", file=sys.stderr)
        return err.code
    simulate(runs, trace, args.start_delay, args.jobs, initial)
    rep = report(runs, trace, name, args.start_delay)
    if args.png:
        from .report import write_png

        results = [replace(r.result, name=r.label) for r in runs]
        write_png(args.png, trace, results, title="PDCTL SIMULATE")
        rep["png"] = args.png
    if args.json:
        print(json.dumps(rep, indent=1, default=float))
    else:
        print(format_text(rep))
    return 0
