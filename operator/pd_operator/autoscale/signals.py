"""The signal source: runs the autoscaler's PromQL against Prometheus.

Thin: the queries and their meaning live in :mod:`.promql`; this module only
sends them (prometheus-api-client) and hands back the parsed observations.
"""

from __future__ import annotations

from prometheus_api_client import PrometheusConnect

from .promql import Observation, by_service, demand_query, latency_queries, observations


class PrometheusSignals:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0):
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self.prom = PrometheusConnect(url=url, headers=headers, disable_ssl=False)
        self.timeout = timeout

    def _query(self, promql: str) -> list[dict]:
        return self.prom.custom_query(query=promql, params={"timeout": f"{self.timeout:g}s"})

    def pool(self, engine: str, role: str, quantile: float, window: str = "1m") -> dict[tuple[str, str], Observation]:
        """Observations of one pool role for every service of an engine: three queries in all."""
        q, rate = latency_queries(engine, role, quantile, window)
        demand = demand_query(engine, role, window)
        return observations(by_service(self._query(q.promql)), by_service(self._query(rate.promql)),
                            by_service(self._query(demand.promql)))
