#!/usr/bin/env bash
# Create (if missing) a kind cluster with 4 GPU-shaped workers and print the
# kubeconfig to use. Then: KUBECONFIG=<printed path> pytest -m integration tests/integration
#   e2e/kind/up.sh [name]        (default name: pd)
#   e2e/kind/load-image.sh [name]   then: build the operator image, load it, helm install the chart
#   kind delete cluster --name pd   to remove it
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
name="${1:-pd}"
kubeconfig="${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind/$name/kubeconfig"
mkdir -p "$(dirname "$kubeconfig")"
if ! kind get clusters 2>/dev/null | grep -qx "$name"; then
  kind create cluster --name "$name" --config "$HERE/kind-config.yaml" --kubeconfig "$kubeconfig" --wait 120s
else
  kind get kubeconfig --name "$name" >"$kubeconfig"
fi
KUBECONFIG="$kubeconfig" "$HERE/gpu-nodes.sh" >&2
echo "$kubeconfig"
