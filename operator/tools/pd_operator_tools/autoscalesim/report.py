"""The benchmark's outputs: a markdown table and a matplotlib figure (request
rate, replicas per pool, SLO attainment per minute) per trace."""

from __future__ import annotations

from .runner import Result
from .trace import Trace


COLUMNS = ("goodput", "ttft_p99", "itl_p99", "gpu_hours", "goodput_per_gpu_hour", "actions", "ratio")


def table_md(results: list[Result], feasible: int | None = None) -> str:
    """One row per policy; with ``feasible`` (requests that could meet the SLO on an idle
    fleet) a column of good requests / feasible requests."""
    extra_h, extra_a = (" goodput / feasible |", "---:|") if feasible else ("", "")
    lines = ["| policy | goodput |" + extra_h + " TTFT p99 (s) | ITL p99 (ms, per token) | mean-ITL p99 (ms, per request) | GPU-hours | "
             "good requests per GPU-hour | scaling actions | GPU-hours / oracle |",
             "|---|---:|" + extra_a + "---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        share = f" {r.goodput * r.requests / feasible:.4f} |" if feasible else ""
        lines.append(f"| {r.name} | {r.goodput:.4f} |{share} {r.ttft_p99:.3f} | {r.itl_p99 * 1e3:.1f} | {r.itl_req_p99 * 1e3:.1f} | "
                     f"{r.gpu_hours:.1f} | {r.goodput_per_gpu_hour:.0f} | {r.actions} | {r.ratio:.3f} |")
    return "\n".join(lines)


def write_png(path: str, trace: Trace, results: list[Result], title: str = "Autoscaling benchmark") -> None:
    """Request rate, prefill and decode replicas of each policy, and the share of
    each minute's requests that met the SLO, on one time axis (hours of day)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def hours(t: float) -> float:
        return trace.start_h + t * trace.speed / 3600

    fig, axes = plt.subplots(4, 1, figsize=(12, 11), sharex=True, constrained_layout=True,
                             gridspec_kw={"height_ratios": [2, 3, 3, 3]})
    ts = [i * 60.0 for i in range(int(trace.duration // 60) + 1)]
    axes[0].plot([hours(t) for t in ts], [trace.rate(t) for t in ts], color="black", linewidth=1)
    axes[0].set_ylabel("requests/s")
    for i, r in enumerate(results):
        style = {"color": "black", "linewidth": 1.5} if r.name == "oracle" else {"color": f"C{i % 10}", "linewidth": 1}
        xs = [hours(t) for t in r.timeline["t"]]
        axes[1].step(xs, r.timeline["prefill"], where="post", label=r.name, **style)
        axes[2].step(xs, r.timeline["decode"], where="post", label=r.name, **style)
        pts = sorted((hours((m + 0.5) * 60), g / n) for m, (n, g) in r.per_min.items() if n)
        axes[3].plot([x for x, _ in pts], [y for _, y in pts], label=r.name, **style)
    axes[1].set_ylabel("prefill replicas")
    axes[2].set_ylabel("decode replicas")
    axes[3].set_ylabel("SLO met per minute")
    axes[3].set_ylim(0.8, 1.005)
    axes[3].set_xlabel("hour of day")
    axes[1].legend(loc="upper left", fontsize="small", ncol=3)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: {trace.hours:g} h from {trace.start_h:g}:00, speed {trace.speed:g}")
    fig.savefig(path, dpi=100)
    plt.close(fig)
