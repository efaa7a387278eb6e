#!/usr/bin/env bash
# Writes a CycloneDX (JSON) SBOM of the shipped binary: the `fleetwatch` crate as the image
# builds it (`--no-default-features`: no sandbox), for this machine's target, with every crate
# it links (versions, licenses, crates.io purls and checksums).
#
#   bash scripts/sbom.sh DIR      writes DIR/fleetwatch-VERSION.cdx.json
#
# cargo-cyclonedx comes from crates.io, pinned (scripts/cargo-tool.sh: `cargo install
# --locked`, cargo checks each crate's sha256 against the index). It works from Cargo.lock
# and needs no build. The SBOM is checked before it is kept: valid JSON, CycloneDX, the
# fleetwatch component at the workspace version, and the dependencies the binary really has
# (tokio, rustls) while the sandbox's (fleetwatch-sim) are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
cyclonedx_version=0.5.9
[ $# -eq 1 ] || { echo "usage: bash scripts/sbom.sh DIR" >&2; exit 2; }
dir="$1"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
target="$(rustc -vV | sed -n 's/^host: //p')"
tool="$(bash scripts/cargo-tool.sh cargo-cyclonedx "$cyclonedx_version")"
export PATH="$(dirname "$tool"):$PATH"

work="$(mktemp -d)"
# cargo-cyclonedx writes one file next to every workspace member's Cargo.toml (it has no -p):
# the binary crate's is kept, the others removed.
name="fleetwatch-sbom-$$"
trap 'rm -rf "$work"; rm -f ./*/"$name.json"' EXIT
cargo cyclonedx --manifest-path cli/Cargo.toml --no-default-features --target "$target" \
  --format json --spec-version 1.5 --no-build-deps --override-filename "$name" >&2
[ -f "cli/$name.json" ] || { echo "error: cargo cyclonedx wrote no cli/$name.json" >&2; exit 1; }
mv "cli/$name.json" "$work/sbom.json"

python3 - "$work/sbom.json" "$version" <<'PY'
import json, sys
path, version = sys.argv[1:]
doc = json.load(open(path))
if doc.get("bomFormat") != "CycloneDX":
    sys.exit(f"{path}: not a CycloneDX document")
main = doc.get("metadata", {}).get("component", {})
if main.get("name") != "fleetwatch" or main.get("version") != version:
    sys.exit(f"SBOM describes {main.get('name')} {main.get('version')}, expected fleetwatch {version}")
names = {c.get("name") for c in doc.get("components", [])}
for need in ("tokio", "rustls", "fleetwatch-hub"):
    if need not in names:
        sys.exit(f"SBOM lacks {need}, which the binary links")
if "fleetwatch-sim" in names:
    sys.exit("SBOM lists fleetwatch-sim: the shipped binary has no sandbox (--no-default-features)")
print(f"{len(names)} components", file=sys.stderr)
PY
mkdir -p "$dir"
out="$dir/fleetwatch-$version.cdx.json"
mv "$work/sbom.json" "$out"
echo "$out"
