#!/usr/bin/env bash
# The main job (README): a PDInferenceService served by the operator, answering.
#
#   e2e/run.sh [EXAMPLE.yaml]   local world (no $KUBECONFIG): local control plane,
#                               CRD, operator, local Prometheus (shipped scrape job),
#                               harness (simulated engines + the real router) behind
#                               the example's pods (default e2e/demo.yaml); prints
#                               the endpoint, a curl that works, and TTFT/ITL in
#                               `kubectl get pdservices`.
#                               With $KUBECONFIG: CRD, operator and example on that
#                               cluster, and what it expects there.
#   e2e/run.sh demo [BENCH ARGS]  a short load through the router (pdctl bench):
#                               progress, TTFT/ITL table, goodput, PNG plot
#   e2e/run.sh down             stop everything it started (and the local cluster)
#
# Background processes (operator, prometheus, harness) keep pid and log files
# under ${XDG_CACHE_HOME:-~/.cache}/pd-operator/run/<cluster>/; the logic is e2e/run.py.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ ! -x .venv/bin/python ]]; then
  echo "creating .venv (first run)"
  python3 -m venv .venv
fi
# pip only when the packaging changed since the last run: a second run starts in seconds
STAMP="$(cat pyproject.toml operator/tools/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)"
if [[ "$(cat .venv/pd-installed.stamp 2>/dev/null)" != "$STAMP" ]] || ! .venv/bin/python -c 'import pd_operator, pd_operator_tools' 2>/dev/null; then
  echo "installing the project into .venv (pip; once per change of pyproject.toml)"
  .venv/bin/python -m pip install --quiet -e . -e ./operator/tools
  echo "$STAMP" >.venv/pd-installed.stamp
fi

if [[ "${1:-}" != "down" && "${1:-}" != "demo" && -z "${KUBECONFIG:-}" ]]; then
  if e2e/controlplane/build.sh --print | cut -d= -f2 | while read -r d; do [[ -d "$d" ]] || exit 1; done; then :; else
    echo "building the local control plane (Go; cold: ~15-20 min on 2 cores, each step is timed below; cached afterwards)"
  fi
  e2e/controlplane/build.sh
fi
exec .venv/bin/python e2e/run.py "$@"
