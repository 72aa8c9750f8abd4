#!/usr/bin/env bash
# Build the operator image and load it into the kind cluster, then install the
# chart with it (the kind path; needs Docker, so it does not run on the local
# control plane, whose kwok nodes run no containers).
#   e2e/kind/load-image.sh [cluster-name]     (default: pd, as e2e/kind/up.sh)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
name="${1:-pd}"
version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/charts/pd-operator/Chart.yaml")"
image="ghcr.io/pd-operator/pd-operator:$version"
docker build -f "$ROOT/operator/Dockerfile" -t "$image" "$ROOT"
kind load docker-image "$image" --name "$name"
kubeconfig="${XDG_CACHE_HOME:-$HOME/.cache}/pd-operator/kind/$name/kubeconfig"
# Helm never upgrades crds/ (and the chart refuses a CRD that is not its own):
# apply this checkout's first, as the chart README says for every upgrade.
kubectl --kubeconfig "$kubeconfig" apply --server-side --force-conflicts \
  -f "$ROOT/charts/pd-operator/crds/pdinferenceservices.yaml"
kubectl --kubeconfig "$kubeconfig" wait --for=condition=Established \
  crd/pdinferenceservices.pdserving.io --timeout=60s
# IfNotPresent + the loaded tag: the kind nodes never pull it.
helm upgrade --install pd-operator "$ROOT/charts/pd-operator" --kubeconfig "$kubeconfig" \
  --namespace pd-operator-system --create-namespace --set image.pullPolicy=IfNotPresent --wait
kubectl --kubeconfig "$kubeconfig" -n pd-operator-system rollout status deployment/pd-operator
echo "operator running in kind cluster $name from image $image"
