#!/usr/bin/env bash
# Writes a CycloneDX (JSON) SBOM of the image: the `fleetwatch` crate as the image builds it
# (`--no-default-features`: no sandbox), for this machine's target, with every crate it links
# (versions, licenses, crates.io purls and checksums), and the Debian packages the image's
# other files come from (glibc, libgcc, CA certificates, base-files: scripts/os-packages.sh,
# purls pkg:deb/debian/NAME@VERSION?arch=ARCH&distro=debian-N), under the OS they belong to.
#
#   bash scripts/sbom.sh DIR [BIN]   writes DIR/fleetwatch-VERSION.cdx.json
#
# BIN is the release binary the image ships (default $CARGO_TARGET_DIR/release/fleetwatch, as
# scripts/image.sh leaves it): the libraries it links decide the packages.
#
# cargo-cyclonedx comes from crates.io, pinned (scripts/cargo-tool.sh: `cargo install
# --locked`, cargo checks each crate's sha256 against the index). It works from Cargo.lock
# and needs no build. The SBOM is checked before it is kept: valid JSON, CycloneDX, the
# fleetwatch component at the workspace version, and the dependencies the binary really has
# (tokio, rustls) while the sandbox's (fleetwatch-sim) are absent.
set -euo pipefail
cd "$(dirname "$0")/.."
cyclonedx_version=0.5.9
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bash scripts/sbom.sh DIR [BIN]" >&2; exit 2; }
dir="$1"
bin="${2:-${CARGO_TARGET_DIR:-target}/release/fleetwatch}"
os_packages="$(bash scripts/os-packages.sh "$bin")"
. /etc/os-release
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

python3 - "$work/sbom.json" "$version" "$os_packages" "$ID" "$VERSION_ID" <<'PY'
import json, sys, urllib.parse
path, version, os_packages, os_id, os_version = sys.argv[1:]
doc = json.load(open(path))
# The OS and its packages, as Trivy and Syft write them for an image.
os_ref = f"os:{os_id}@{os_version}"
doc.setdefault("components", []).append(
    {"type": "operating-system", "bom-ref": os_ref, "name": os_id, "version": os_version})
deb = []
for line in os_packages.splitlines():
    name, pkg_version, arch, source, source_version = line.split()
    purl = (f"pkg:deb/{os_id}/{name}@{urllib.parse.quote(pkg_version, safe='')}"
            f"?arch={arch}&distro={os_id}-{os_version.split('.')[0]}")
    c = {"type": "library", "bom-ref": purl, "name": name, "version": pkg_version, "purl": purl,
         "properties": [{"name": "debian:source", "value": f"{source} {source_version}"}]}
    deb.append(c)
doc["components"].extend(deb)
doc.setdefault("dependencies", []).append({"ref": os_ref, "dependsOn": [c["bom-ref"] for c in deb]})
if not any(c["name"] == "libc6" for c in deb):
    sys.exit("the OS packages lack libc6, which the binary links")
json.dump(doc, open(path, "w"), indent=2)
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
