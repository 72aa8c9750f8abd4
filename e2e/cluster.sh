#!/usr/bin/env bash
# Local control plane with GPU-shaped fake nodes: up | down | delete | status |
# kubeconfig | kubectl ARGS... | build. The logic lives in e2e/cluster.py (stdlib
# only), which the pytest fixtures import too; see its docstring.
set -euo pipefail
exec python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/cluster.py" "$@"
