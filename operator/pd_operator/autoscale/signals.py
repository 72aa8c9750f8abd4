"""The signal source: runs the autoscaler's PromQL against Prometheus.

Thin: the queries and their meaning live in :mod:`.promql`; this module only
sends them (prometheus-api-client) and hands back the parsed observations.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_api_client import PrometheusConnect

from .promql import Observation, by_service, observations, pool_queries


class PrometheusSignals:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0):
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.prom = PrometheusConnect(url=url, headers=headers, disable_ssl=False)
        self.timeout = timeout

    def _query(self, promql: str) -> list[dict]:
        return self.prom.custom_query(query=promql, params={"timeout": f"{self.timeout:g}s"})

    def pool(self, engine: str, role: str, quantile: float, window: str = "1m",
             secondaries: Iterable[str] = ()) -> dict[tuple[str, str], Observation]:
        """Observations of one pool role for every service of an engine: one query
        per signal (latency quantile, its rate, demand, the mean lengths of the
        capacity estimate), plus one per secondary signal in ``secondaries``
        (``queueDepth``, ``kvCacheUsage``: pass the union of what the services
        of this engine and role ask for, none when none does)."""
        results = {name: by_service(self._query(q.promql))
                   for name, q in pool_queries(engine, role, quantile, window, secondaries).items()}
        return observations(results.pop("quantile"), results.pop("rate"), results.pop("demand"), results)
