#!/usr/bin/env bash
# Command 1: set everything up and run the main job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. scripts/setup.sh
echo "==> offgraph-kv demo"
offgraph-kv demo "$@"
