"""The signal source: runs the autoscaler's PromQL against Prometheus.

Thin: the queries and their meaning live in :mod:`.promql`; this module only
sends them (prometheus-api-client) and hands back the parsed observations.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from .capacity import length_bias
from .diagnose import WINDOW, Signals, diagnosis_queries, merge, signals_by_service
from .promql import BUCKET_FIELDS, BUCKET_QUERIES, Observation, by_service, by_service_buckets, observations, pool_queries


# A Prometheus that accepts a connection and never answers must not hold the
# autoscaler: every request has a connect and a read timeout (requests' own,
# seconds; the read timeout bounds each wait for bytes from the server).
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 15.0


class PrometheusSignals:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0,
                 connect_timeout: float | None = None, read_timeout: float | None = None):
        headers = {"Authorization": f"Bearer {token}"} if token else None
        # No retry after a read timeout (the client's default retries would
        # multiply the wait); one retry of a refused connection or a 502-504.
        retry = Retry(total=1, read=0, backoff_factor=0.2, status_forcelist=(502, 503, 504))
        self.prom = PrometheusConnect(url=url, headers=headers, disable_ssl=False, retry=retry)
        self.timeout = timeout  # the query's own evaluation timeout, enforced by Prometheus
        self.http_timeout = (CONNECT_TIMEOUT_S if connect_timeout is None else connect_timeout,
                             READ_TIMEOUT_S if read_timeout is None else read_timeout)

    def _query(self, promql: str) -> list[dict]:
        return self.prom.custom_query(query=promql, params={"timeout": f"{self.timeout:g}s"}, timeout=self.http_timeout)

    def pool(self, engine: str, role: str, quantile: float, window: str = "1m",
             secondaries: Iterable[str] = ()) -> dict[tuple[str, str], Observation]:
        """Observations of one pool role for every service of an engine: one query
        per signal (latency quantile, its rate, demand, the mean lengths of the
        capacity estimate), plus one per secondary signal in ``secondaries``
        (``queueDepth``, ``kvCacheUsage``: pass the union of what the services
        of this engine and role ask for, none when none does)."""
        queries = pool_queries(engine, role, quantile, window, secondaries)
        hist = queries.pop("osl_hist", None)
        buckets = {BUCKET_FIELDS[name]: queries.pop(name) for name in BUCKET_QUERIES if name in queries}
        results = {name: by_service(self._query(q.promql)) for name, q in queries.items()}
        for name, q in buckets.items():
            results[name] = {key: tuple(sorted(b)) for key, b in by_service_buckets(self._query(q.promql)).items()}
        if hist is not None:
            results["osl_bias"] = {key: bias for key, buckets in by_service_buckets(self._query(hist.promql)).items()
                                   if (bias := length_bias(buckets)) is not None}
        return observations(results.pop("quantile"), results.pop("rate"), results.pop("demand"), results)

    def diagnosis(self, engine: str, router: str, window: str = WINDOW) -> dict[tuple[str, str], Signals]:
        """The Serving signals of every service of one (engine, router): one query per signal."""
        return signals_by_service({name: merge([self._query(p) for p in q.promql])
                                   for name, q in diagnosis_queries(engine, router, window).items()})
