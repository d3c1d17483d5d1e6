#!/usr/bin/env bash
# Installs what offgraph-kv needs on a Debian 12 machine (as root) and builds
# the Python package into ./.venv. Idempotent: re-running skips what is there.
# Sourced by demo.sh and test.sh; PIP_EXTRA_PKGS adds pip packages ("torch>=2.4 ...").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# What the build needs; APT_EXTRA_PKGS adds what the tests need (test.sh: valgrind, redis).
# shellcheck disable=SC2206
APT_PKGS=(build-essential pkg-config libxnnpack-dev ${APT_EXTRA_PKGS:-})
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "cargo not found: install Rust >= 1.80 (rustup), then re-run." >&2
  exit 1
fi

if [ ! -x .venv/bin/python ]; then
  echo "==> python3 -m venv .venv"
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
PIP=(python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" "maturin>=1.5,<2" "numpy>=1.22" ${PIP_EXTRA_PKGS:-}

echo "==> maturin develop --release"
log=$(mktemp)
if ! maturin develop --release >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
rm -f "$log"
python -c "import offgraph_kv" || { echo "offgraph_kv failed to import" >&2; exit 1; }
