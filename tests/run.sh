#!/usr/bin/env bash
# The test command (README): installs what the tests need, builds the local
# control plane if missing (cached outside the clone), runs the whole suite.
#
#   tests/run.sh                 everything: unit, contract, integration
#   tests/run.sh -m "not integration"   no cluster needed
#   tests/run.sh ARGS...         extra pytest arguments
#
# With KUBECONFIG pointing at a reachable cluster (kind, ...), the integration
# tests use it instead of the local one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet -e '.[test]'

# Real Prometheus (Debian package): promtool checks the chart's alert rules
# and dashboard queries; the autoscaling e2e scrapes the simulated engines.
if ! command -v promtool >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  systemctl disable --now prometheus >/dev/null 2>&1 || true  # tests start their own
fi

# The real control plane (kube-apiserver, etcd, scheduler, controller-manager,
# kwok, helm) from Go modules; a no-op when the cache has it.
if [[ -z "${KUBECONFIG:-}" ]]; then
  e2e/controlplane/build.sh
fi

exec .venv/bin/python -m pytest "$@"
