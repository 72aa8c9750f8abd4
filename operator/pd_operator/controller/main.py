"""``python -m pd_operator`` / ``pd-operator``: run the operator."""

from __future__ import annotations

import argparse
import logging
import sys

import kopf
from kubernetes import client
from kubernetes import config as kube_config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pd-operator", description="Run the pd-operator controller (kopf).")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch all namespaces (default when no --namespace)")
    p.add_argument("--liveness-port", type=int, default=8080, help="port of the liveness endpoint /healthz (0: off)")
    p.add_argument("--metrics-port", type=int, default=9090, help="port of the Prometheus metrics endpoint (0: off)")
    p.add_argument("--bind", default=None,
                   help="address the liveness, metrics and webhook endpoints bind (default: :: with IPv4 too, "
                        "or 0.0.0.0 where the node has no IPv6)")
    p.add_argument("--prometheus-token-url", action="append", default=[], metavar="URL",
                   help="a Prometheus endpoint that may receive the bearer token of a service's "
                        "spec.autoscaling.prometheus.bearerTokenSecretRef (repeatable; scheme, host, port and a path "
                        "prefix must match). None given: no token is ever read or sent")
    p.add_argument("--free-gpu-cap", action=argparse.BooleanOptionalAction, default=True,
                   help="cap a scale-up at the replicas the GPUs free now fit (default on); --no-free-gpu-cap "
                        "where a cluster autoscaler or Karpenter adds GPU nodes for Pending pods (the cap would "
                        "keep a pool from ever asking for them; the Unschedulable guard still holds)")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                   help="hold a coordination.k8s.io Lease to be the one replica that writes (default on; "
                        "the others watch and take over within --lease-duration seconds)")
    p.add_argument("--lease-namespace", default=None,
                   help="namespace of the Lease (default: $POD_NAMESPACE, else the first --namespace, else default)")
    p.add_argument("--lease-name", default="pd-operator-leader",
                   help="name of the Lease (default pd-operator-leader); operators sharing a Lease have one "
                        "writer among them, so each installation in one namespace needs its own")
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds without renewal before a standby takes over")
    p.add_argument("--lease-renew", type=float, default=5.0, help="seconds between renewals (and a standby's checks)")
    p.add_argument("--webhook-port", type=int, default=0,
                   help="serve the validating admission webhook (HTTPS, path /validate) on this port (0: off)")
    p.add_argument("--webhook-cert", default="/etc/pd-operator/webhook/tls.crt", help="the webhook's TLS certificate")
    p.add_argument("--webhook-key", default="/etc/pd-operator/webhook/tls.key", help="the webhook's TLS key")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.leader_elect and not 0 < 2 * args.lease_renew < args.lease_duration:
        # the holder writes only within duration - renew of its last renewal (its renew
        # deadline), and renews every renew seconds: the deadline must outlast a renewal
        parser.error(f"--lease-renew ({args.lease_renew:g}) must be under half of --lease-duration "
                     f"({args.lease_duration:g}): the leader writes only within lease-duration - "
                     "lease-renew of its last renewal, which must leave room for the next one")
    if args.bind is None:
        from .health import default_bind

        args.bind = default_bind()
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        kube_config.load_incluster_config()
    except kube_config.ConfigException:
        kube_config.load_kube_config()
    # connections kept open: the reconcile workers, their parallel dry-runs, the
    # autoscaler and the leader election (the default, 5 per CPU, would drop and
    # re-open TLS connections under a burst of creates)
    cfg = client.Configuration.get_default_copy()
    cfg.connection_pool_maxsize = 32
    client.Configuration.set_default(cfg)

    from . import handlers  # registers the handlers

    handlers.STATE["namespaces"] = list(args.namespace)
    handlers.STATE["token_urls"] = list(args.prometheus_token_url)
    handlers.STATE["free_gpu_cap"] = args.free_gpu_cap
    if args.leader_elect:
        import os

        from .kube import Kube
        from .leader import LeaderElector

        lease_ns = args.lease_namespace or os.environ.get("POD_NAMESPACE") or (args.namespace or ["default"])[0]
        handlers.STATE["elector"] = LeaderElector(Kube(), lease_ns, name=args.lease_name,
                                                 duration=args.lease_duration, renew=args.lease_renew)
    if not args.verbose:
        # kopf logs every handler run at INFO; child events make that a flood.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    if args.metrics_port:
        from .health import serve_metrics

        serve_metrics(args.bind, args.metrics_port)
    if args.webhook_port:
        from .webhook import serve as serve_webhook

        serve_webhook(args.bind, args.webhook_port, args.webhook_cert, args.webhook_key, kube=handlers.kube)
    if args.liveness_port:
        # /healthz follows the operator's own loops (controller/health.py): 503
        # when the autoscaler or the resync stops making progress.
        from .health import HEALTH, serve

        serve(HEALTH, args.bind, args.liveness_port)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
