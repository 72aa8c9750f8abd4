"""``pdctl bench --plot``: TTFT and TPOT (mean ITL) of every request over the run,
with the SLOs, failed requests marked (matplotlib, no display needed)."""

from __future__ import annotations


def write_png(path: str, results: list, ttft_slo: float = 1.0, itl_slo: float = 0.05,
              replicas: list | None = None) -> None:
    """``replicas``: optional (t, prefill, decode) samples on the same time axis
    (seconds since the run began), drawn as a third panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ok = [r for r in results if r.ok]
    failed = [r.start for r in results if not r.ok]
    rows = 3 if replicas else 2
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3 * rows), sharex=True, constrained_layout=True)
    panels = (("TTFT per request (ms)", [(r.start, r.ttft * 1e3) for r in ok], ttft_slo * 1e3),
              ("TPOT: mean ITL per request (ms)", [(r.start, r.mean_itl * 1e3) for r in ok if r.mean_itl is not None],
               itl_slo * 1e3))
    if replicas:
        ax = axes[2]
        ts = [t for t, _, _ in replicas]
        ax.step(ts, [p for _, p, _ in replicas], where="post", label="prefill")
        ax.step(ts, [d + 0.03 for _, _, d in replicas], where="post", label="decode")  # offset: both visible
        ax.set_ylabel("replicas (autoscaler)")
        ax.set_ylim(0, max(max(p, d) for _, p, d in replicas) + 0.5)
        ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    for ax, (label, pts, slo) in zip(axes, panels):
        ax.scatter([t for t, _ in pts], [v for _, v in pts], s=6, label="completed")
        ax.axhline(slo, color="tab:red", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        if failed:
            ax.scatter(failed, [0] * len(failed), marker="|", color="tab:red", s=80, label="failed")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize="small")
    axes[-1].set_xlabel("request start (s since the run began)")
    fig.suptitle(f"pdctl bench: {len(ok)}/{len(results)} completed")
    fig.savefig(path, dpi=100)
    plt.close(fig)
