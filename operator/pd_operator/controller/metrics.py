"""The operator's own Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("pd_operator_reconciles_total", "Reconciles by outcome (ok, invalid, error)", ["outcome"])
ERRORS = Counter("pd_operator_reconcile_errors_total", "Reconciles that raised, by exception type", ["error"])
DURATION = Histogram(
    "pd_operator_reconcile_duration_seconds", "Time to reconcile one PDInferenceService, by outcome", ["outcome"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
APPLIED = Counter("pd_operator_objects_applied_total", "Child objects server-side applied, by kind", ["kind"])
PRUNED = Counter("pd_operator_objects_pruned_total", "Child objects deleted because the spec no longer renders them", ["kind"])
API_REQUESTS = Counter("pd_operator_api_requests_total",
                       "Requests the operator sent to the API server (its watches aside), by verb", ["verb"])
LEADER = Gauge("pd_operator_leader", "1 while this replica holds the leader Lease (it is the one that writes)")
READY = Gauge("pd_operator_service_ready", "1 when a PDInferenceService is Ready", ["namespace", "name"])


def forget_service(namespace: str, name: str) -> None:
    """Drop a deleted service's series (one per service would otherwise grow forever)."""
    try:
        READY.remove(namespace, name)
    except KeyError:
        pass
