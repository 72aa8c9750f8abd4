#!/usr/bin/env bash
# The main job (README): a PDInferenceService served by the operator.
#
#   e2e/run.sh [EXAMPLE.yaml]   local control plane (unless KUBECONFIG names a
#                               cluster), CRD, operator, example, kubectl get pdservices
#   e2e/run.sh down             stop the operator and the local control plane
#
# The operator keeps running in the background (log and pid under
# ${XDG_CACHE_HOME:-~/.cache}/pd-operator/run/); edit the example and re-apply it
# to watch it reconcile.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
RUN_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/run"
mkdir -p "$RUN_DIR"
PIDFILE="$RUN_DIR/operator.pid"

stop_operator() {
  if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")"; sleep 1
  fi
  rm -f "$PIDFILE"
}

if [[ "${1:-}" == "down" ]]; then
  stop_operator
  [[ -n "${KUBECONFIG:-}" ]] || python3 e2e/cluster.py down
  exit 0
fi
EXAMPLE="${1:-manifests/examples/vllm-nixl.yaml}"

if [[ ! -x .venv/bin/python ]]; then python3 -m venv .venv; fi
.venv/bin/python -m pip install --quiet -e . -e ./operator/tools

if [[ -n "${KUBECONFIG:-}" ]]; then
  KUBECTL=(kubectl)
else
  e2e/controlplane/build.sh
  KUBECONFIG="$(python3 e2e/cluster.py up | tail -n 1)"
  export KUBECONFIG
  KUBECTL=(python3 e2e/cluster.py kubectl)
fi
echo "cluster: $KUBECONFIG"

# The repository's CRD is the truth: take over its fields from whoever applied
# an older one (an earlier checkout, the integration tests on this cluster).
"${KUBECTL[@]}" apply --server-side --force-conflicts --field-manager=pd-operator-crd -f crds/pdinferenceservices.yaml
"${KUBECTL[@]}" wait --for=condition=Established crd/pdinferenceservices.pdserving.io --timeout=60s

stop_operator
nohup .venv/bin/python -m pd_operator --all-namespaces --liveness-port 8080 --metrics-port 9090 \
  >"$RUN_DIR/operator.log" 2>&1 &
echo $! >"$PIDFILE"
echo "operator: pid $(cat "$PIDFILE"), log $RUN_DIR/operator.log, metrics http://127.0.0.1:9090/metrics"

.venv/bin/pdctl validate -f "$EXAMPLE"
"${KUBECTL[@]}" apply -f "$EXAMPLE"
NAME="$(.venv/bin/python -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"]["name"])' "$EXAMPLE")"
NS="$(.venv/bin/python -c 'import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))["metadata"].get("namespace","default"))' "$EXAMPLE")"
"${KUBECTL[@]}" wait -n "$NS" --for=condition=Ready "pdservice/$NAME" --timeout=180s
"${KUBECTL[@]}" get pdservices -A
"${KUBECTL[@]}" get pods -n "$NS" -l "pdserving.io/service=$NAME" -o wide
echo "stop with: e2e/run.sh down"
