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
# The runtime closure at the versions the operator image pins (operator/Dockerfile's
# constraints): the tests run with what the image installs, not with whatever PyPI
# published since (tests/unit/test_images.py checks the two agree).
PINS="$(mktemp)"
sed -n "/<<'PINS'/,/^PINS\$/p" operator/Dockerfile | sed '1d;$d' > "$PINS"
.venv/bin/python -m pip install --quiet --constraint "$PINS" -e '.[test]' -e ./operator/tools
rm -f "$PINS"

# The real control plane (kube-apiserver, etcd, scheduler, controller-manager,
# kwok, helm) and Prometheus (prometheus, promtool: the chart's rules, the
# autoscaler's queries, the closed-loop e2e) from Go modules; a no-op when the
# cache has them. Prometheus is needed even against an external cluster.
e2e/controlplane/build.sh
eval "$(e2e/controlplane/build.sh --print | grep '^PROMETHEUS_BIN_DIR=')"
export PATH="$PROMETHEUS_BIN_DIR:$PATH"

exec .venv/bin/python -m pytest "$@"
