"""``pdctl doctor NAME``: what a PD service is doing and what to do about it.

Reads the cluster (the kubeconfig's credentials: the service, its pods, its
Events) and the service's Prometheus (``spec.autoscaling.prometheus.url``, or
``--prometheus`` e.g. through ``kubectl port-forward``), then prints the
service's conditions, its pods, the last hour of the Serving condition's
signals (autoscale/diagnose.py, the same grouped queries the operator runs)
and the diagnosis with the fix. :func:`report` is pure; :func:`run` gathers.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from .api.constants import GROUP, KIND, LABEL_ROLE, LABEL_SERVICE, PLURAL, VERSION
from .autoscale.diagnose import WINDOW, Verdict

# signal -> what it counts, as printed
SIGNALS = {
    "requests": "requests through the router",
    "worker_errors": "requests the workers refused (router)",
    "kv_failures": "failed/expired KV transfers (engines)",
    "overload": "refused at a queue limit (503/429)",
    "not_found": "requests for another model (404)",
    "unhealthy": "workers the router cannot reach",
}
BARS = " ▁▂▃▄▅▆▇█"


@dataclass
class History:
    """One signal over the last hour: (unix time, value) samples; None: no series."""

    points: list[tuple[float, float]]

    def spark(self, buckets: int = 12) -> str:
        if not self.points:
            return "(no data)"
        start, end = self.points[0][0], self.points[-1][0]
        width = max(1.0, (end - start) / buckets)
        peaks = [0.0] * buckets
        for t, v in self.points:
            i = min(buckets - 1, int((t - start) / width))
            peaks[i] = max(peaks[i], v)
        top = max(peaks)
        if top <= 0:
            return BARS[1] * buckets
        return "".join(BARS[max(1, math.ceil(p / top * (len(BARS) - 1)))] if p > 0 else BARS[1] for p in peaks)

    @property
    def peak(self) -> float:
        return max((v for _, v in self.points), default=0.0)


def _age(stamp: str | None, now: float) -> str:
    if not stamp:
        return "?"
    try:
        t = time.mktime(time.strptime(stamp.replace("Z", ""), "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except ValueError:
        return stamp
    s = max(0, int(now - t))
    return f"{s}s" if s < 120 else (f"{s // 60}m" if s < 7200 else f"{s // 3600}h")


def _pod_line(pod: dict) -> str:
    meta, st = pod.get("metadata") or {}, pod.get("status") or {}
    statuses = st.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    role = (meta.get("labels") or {}).get(LABEL_ROLE, "?")
    why = next((c.get("message") or c.get("reason") for c in st.get("conditions") or []
                if c.get("status") == "False" and (c.get("message") or c.get("reason"))), "")
    return (f"  {meta.get('name', '?'):<40} {role:<8} {st.get('phase', '?'):<9} {ready}/{len(statuses) or 1:<3} "
            f"restarts {restarts:<3} {pod.get('spec', {}).get('nodeName') or '-'}" + (f"  ({why})" if why else ""))


def report(body: dict, pods: list[dict], events: list[dict], history: dict[str, History] | None,
           verdict: Verdict | None, prometheus: str | None, problem: str | None = None, now: float | None = None) -> str:
    """The doctor's page (pure)."""
    now = time.time() if now is None else now
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    out = [f"PDInferenceService {meta['namespace']}/{meta['name']}: {spec.get('engine', {}).get('kind', '?')} engines, "
           f"serving {status.get('servedModelName', '?')} at {status.get('endpoint', '?')}"]
    out.append("\nConditions:")
    for c in status.get("conditions") or []:
        out.append(f"  {c.get('type', ''):<18} {c.get('status', ''):<7} {c.get('reason', ''):<24} "
                   f"{_age(c.get('lastTransitionTime'), now):>4}  {c.get('message', '')}")
    out.append(f"\nPods ({len(pods)}):")
    out += [_pod_line(p) for p in sorted(pods, key=lambda p: p["metadata"]["name"])] or ["  (none)"]
    out.append(f"\nLast hour (peak per 5 min, counts per {WINDOW} window) from {prometheus or 'no Prometheus'}:")
    if history is None:
        out.append(f"  {problem or 'no Prometheus: set spec.autoscaling.prometheus.url or pass --prometheus URL'}")
    else:
        for name, label in SIGNALS.items():
            h = history.get(name)
            if h is None or not h.points:
                continue
            out.append(f"  {label:<40} {h.spark()}  peak {h.peak:g}")
        if not any(history.get(n) and history[n].points for n in SIGNALS):
            out.append("  (no series for this service: are the router and engine pods scraped? "
                       "manifests/prometheus/scrape-engines.yaml)")
    out.append("\nNow:")
    if verdict is None:
        serving = next((c for c in status.get("conditions") or [] if c.get("type") == "Serving"), None)
        out.append(f"  {serving['reason']}: {serving['message']}" if serving else "  no live signals")
    elif verdict.status == "True":
        out.append(f"  Serving: {verdict.message}")
    else:
        out.append(f"  {verdict.reason}: {verdict.message}")
    warnings = [e for e in events if e.get("type") == "Warning"][-5:]
    if warnings:
        out.append("\nRecent warnings:")
        for e in warnings:
            out.append(f"  {_age(e.get('lastTimestamp') or e.get('eventTime'), now):>4}  {e.get('reason')}: {e.get('message')}")
    return "\n".join(out) + "\n"


def history_from(ranges: dict[str, list[dict]], namespace: str, name: str) -> dict[str, History]:
    """Range-query results (signal -> matrix, grouped by service) -> this service's History."""
    out = {}
    for signal, matrix in ranges.items():
        for series in matrix or []:
            m = series.get("metric", {})
            if m.get("namespace") == namespace and m.get("pdserving_io_service") == name:
                pts = [(float(t), float(v)) for t, v in series.get("values", []) if math.isfinite(float(v))]
                old = out.get(signal)
                if old is not None:  # a signal of several metrics: add them up per timestamp
                    acc = dict(old.points)
                    for t, v in pts:
                        acc[t] = acc.get(t, 0.0) + v
                    pts = sorted(acc.items())
                out[signal] = History(pts)
    return out


def run(name: str, namespace: str, prometheus: str | None = None, token: str | None = None) -> int:
    """Gather and print; 0 when serving, 1 when a failure is diagnosed, 2 when the service cannot be read."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    from .api import SpecError, validate_service
    from .autoscale.diagnose import diagnose, diagnosis_queries, ready_pod_ips
    from .render.pools import serving_selector
    from .render.engines import engine_for

    try:
        try:
            config.load_kube_config()
        except config.ConfigException:
            config.load_incluster_config()
        api = client.ApiClient()
        body = client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        core = client.CoreV1Api(api)
        pods = [api.sanitize_for_serialization(p) for p in
                core.list_namespaced_pod(namespace, label_selector=f"{LABEL_SERVICE}={name}").items]
        events = [api.sanitize_for_serialization(e) for e in core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.kind={KIND},involvedObject.name={name}").items]
    except ApiException as err:
        what = "not found" if err.status == 404 else f"{err.status} {err.reason}"
        print(f"pdctl doctor: PDInferenceService {namespace}/{name}: {what}", file=sys.stderr)
        return 2
    except config.ConfigException as err:
        print(f"pdctl doctor: no cluster credentials: {err}", file=sys.stderr)
        return 2
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    try:
        svc = validate_service(body)
    except SpecError as err:
        print(report(body, pods, events, None, None, None, f"the spec is invalid: {err}"), end="")
        return 1
    spec = svc.spec
    url = prometheus or (spec.autoscaling.prometheus.url if spec.autoscaling.prometheus else None)
    history, verdict, problem = None, None, None
    if url:
        from .autoscale.signals import PrometheusSignals

        router = spec.router_kind()
        try:
            sig = PrometheusSignals(url, token=token)
            now = time.time()
            ranges: dict[str, list[dict]] = {}
            for signal, q in diagnosis_queries(spec.engine.kind, router).items():
                if signal not in SIGNALS:
                    continue
                for promql in q.promql:
                    ranges.setdefault(signal, []).extend(sig.prom.custom_query_range(
                        promql, start_time=_dt(now - 3600), end_time=_dt(now), step="60"))
            history = history_from(ranges, namespace, name)
            # the pods the router discovers: its selectors (an LWS group's leader only)
            sels = [serving_selector(svc, role).items() for role in ("prefill", "decode")]
            ips = ready_pod_ips([p for p in pods if any(sel <= (p["metadata"].get("labels") or {}).items()
                                                        for sel in sels)])
            key_ref = spec.engine.api_key_secret_ref
            verdict = diagnose(sig.diagnosis(spec.engine.kind, router).get((namespace, name)),
                               served_name=spec.served_model_name(), engine=spec.engine.kind, router=router,
                               backend=spec.backend(), engine_port=engine_for(svc).http_port,
                               ready_workers=len(ips), ready_ips=ips,
                               key_ref=f"Secret {key_ref.name} key {key_ref.key}" if key_ref else None)
        except Exception as err:  # noqa: BLE001 - said in the report; the cluster part is still useful
            history, problem = None, f"cannot query {url}: {err} (from outside the cluster: kubectl port-forward " \
                                     "the Prometheus Service and pass --prometheus http://127.0.0.1:PORT)"
    print(report(body, pods, events, history, verdict, url, problem), end="")
    if verdict is not None:
        return 0 if verdict.status == "True" else 1
    serving = next((c for c in (body.get("status") or {}).get("conditions") or [] if c.get("type") == "Serving"), None)
    return 1 if serving and serving.get("status") == "False" else 0


def _dt(t: float):
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc)
