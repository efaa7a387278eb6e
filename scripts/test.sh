#!/usr/bin/env bash
# Runs every check and test of fleetwatch, installing what they need first.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v kubectl >/dev/null || echo "warning: kubectl not found; the sim scenario tests need it" >&2
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi
command -v cargo-nextest >/dev/null || cargo install --locked cargo-nextest

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== CRD manifests up to date"
cargo run --quiet --locked -p fleetwatch -- crds --check
echo "== doc tests"
cargo test --workspace --doc --locked --quiet
echo "== tests"
cargo nextest run --workspace --locked
