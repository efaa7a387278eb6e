#!/usr/bin/env bash
# Prints the path of a cargo subcommand binary at a pinned version, installing it from
# crates.io when neither PATH nor the tools cache has that version.
#
#   bash scripts/cargo-tool.sh CRATE VERSION [BINARY]
#
# `cargo install --locked CRATE@VERSION` builds exactly the versions in the crate's own
# Cargo.lock, and cargo checks every downloaded .crate against the sha256 the crates.io index
# records: crates.io's channel gives no other hash to pin. It installs into
# $FLEETWATCH_TOOLS/CRATE-VERSION (default ~/.cache/fleetwatch-tools), so a second run finds it
# and installs nothing. Progress goes to stderr; stdout is the path only.
set -euo pipefail
crate="$1" version="$2" bin="${3:-$1}"
tools="${FLEETWATCH_TOOLS:-$HOME/.cache/fleetwatch-tools}"

# `cargo-foo --version` prints "cargo-foo 1.2.3" (some print "foo 1.2.3", or the subcommand
# name first when run through cargo); the version is the word after the name.
has_version() { "$1" --version 2>/dev/null | head -1 | tr ' ' '\n' | grep -qx "$version"; }
# cargo subcommands called directly want their subcommand name as the first argument.
has_version_sub() { "$1" "${bin#cargo-}" --version 2>/dev/null | head -1 | tr ' ' '\n' | grep -qx "$version"; }

on_path="$(command -v "$bin" || true)"
if [ -n "$on_path" ] && { has_version "$on_path" || has_version_sub "$on_path"; }; then echo "$on_path"; exit 0; fi
root="$tools/$crate-$version"
if [ -x "$root/bin/$bin" ]; then echo "$root/bin/$bin"; exit 0; fi
echo "installing $crate $version (cargo install --locked) into $root" >&2
cargo install --quiet --locked --root "$root" "$crate@$version" >&2 \
  || { echo "error: cannot install $crate $version from crates.io" >&2; exit 1; }
[ -x "$root/bin/$bin" ] || { echo "error: $crate $version installed no $bin" >&2; exit 1; }
echo "$root/bin/$bin"
