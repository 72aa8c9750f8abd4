#!/usr/bin/env bash
# Make kind's worker nodes look like the local control plane's GPU nodes.
#
#   e2e/kind/gpu-nodes.sh [--context kind-pd]
#
# For the i-th worker (sorted by name) it takes gpu-node-<i> from
# e2e/controlplane/nodes.yaml and
#   * applies its labels (GFD nvidia.com/gpu.*, zone, rack), except the ones the
#     kubelet owns (kubernetes.io/hostname, os, arch) and the kwok-only `type`;
#   * adds its extended resources (nvidia.com/gpu, rdma/...) to the node's
#     status.capacity and status.allocatable through the status subresource
#     (the documented way to advertise extended resources without a device
#     plugin). The kubelet keeps extended resources it does not manage; cpu,
#     memory and pods stay the real ones of the kind node.
# Pods then schedule exactly as on the local control plane and really run (the
# kubelet admits extended resources no device plugin claims). Note: a kubelet
# restart with a lost device-manager checkpoint zeroes them; re-run the script.
#
# Needs kubectl and python3 (stdlib only). Idempotent.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NODES_YAML="$HERE/../controlplane/nodes.yaml"
KUBECTL=(kubectl)
if [[ "${1:-}" == "--context" ]]; then KUBECTL+=(--context "$2"); fi

# nodes.yaml -> JSON via kubectl's client-side decoder (no PyYAML needed); it
# prints one JSON document per YAML document, normalised here into one list.
nodes_json="$("${KUBECTL[@]}" create --dry-run=client -o json -f "$NODES_YAML" | python3 -c '
import json, sys
text, dec, pos, items = sys.stdin.read(), json.JSONDecoder(), 0, []
while pos < len(text):
    if text[pos].isspace():
        pos += 1
        continue
    obj, pos = dec.raw_decode(text, pos)
    items.extend(obj["items"] if obj.get("kind") == "List" else [obj])
print(json.dumps(items))
')"
mapfile -t workers < <("${KUBECTL[@]}" get nodes -l '!node-role.kubernetes.io/control-plane' \
  -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)

count="$(python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' <<<"$nodes_json")"
if (( ${#workers[@]} < count )); then
  echo "need $count worker nodes, found ${#workers[@]}: ${workers[*]:-none}" >&2
  exit 1
fi

PATCHES_PY='
import json, sys
n = json.load(sys.stdin)[int(sys.argv[1])]
skip = {"kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch", "type"}
labels = {k: v for k, v in n["metadata"]["labels"].items() if k not in skip}
def ext(res):  # extended resources only: names with a domain, not kubernetes.io
    return {k: v for k, v in res.items() if "/" in k and "kubernetes.io/" not in k}
status = {"status": {"capacity": ext(n["status"]["capacity"]),
                     "allocatable": ext(n["status"]["allocatable"])}}
print(json.dumps({"metadata": {"labels": labels}}, separators=(",", ":")),
      json.dumps(status, separators=(",", ":")))
'

for i in $(seq 0 $((count - 1))); do
  node="${workers[$i]}"
  # Two merge patches per node: metadata (labels) and status (capacity).
  read -r labels_patch status_patch < <(python3 -c "$PATCHES_PY" "$i" <<<"$nodes_json")
  "${KUBECTL[@]}" patch node "$node" --type merge -p "$labels_patch" >/dev/null
  "${KUBECTL[@]}" patch node "$node" --subresource=status --type merge -p "$status_patch" >/dev/null
  echo "$node <- gpu-node-$i shape"
done
"${KUBECTL[@]}" get nodes \
  -o custom-columns='NAME:.metadata.name,GPU:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product,CLIQUE:.metadata.labels.nvidia\.com/gpu\.clique'
