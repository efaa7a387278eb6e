#!/usr/bin/env bash
# Checks Cargo.lock against the RustSec advisory database, offline, with cargo-deny:
# vulnerabilities, unsound, unmaintained and yanked crates are errors (deny.toml's
# [advisories], where each exception carries its reason).
#
#   bash scripts/advisories.sh [CARGO_DENY]
#
# The machines that run the tests cannot reach the database's host, so the check reads a
# snapshot: a tarball holding a git checkout of github.com/RustSec/advisory-db in a folder
# named advisory-db-3157b0e258782691 (the name cargo-deny gives the default database under
# its db-path). It is looked for, first found wins, at
#   $FLEETWATCH_ADVISORY_DB            (a path to such a tarball)
#   <checkout>/../shared/rustsec-advisory-db.tar.gz
#   /work/shared/rustsec-advisory-db.tar.gz
# and extracted to a temporary directory (deny.toml's db-path is $FLEETWATCH_ADVISORY_DBS).
# No snapshot found is an error, never a skipped check. Refreshing it: docs/release.md.
#
# Before the real check, a canary: a copy of the database with one made-up advisory against
# the tokio in Cargo.lock must make cargo-deny fail. It proves the database is read at all (a
# wrong folder name or db-path would otherwise pass with nothing checked). ~2 s in all.
set -euo pipefail
cd "$(dirname "$0")/.."
deny="${1:-cargo-deny}"
name=advisory-db-3157b0e258782691

tarball=""
for c in "${FLEETWATCH_ADVISORY_DB:-}" "$(cd .. && pwd)/shared/rustsec-advisory-db.tar.gz" /work/shared/rustsec-advisory-db.tar.gz; do
  if [ -n "$c" ] && [ -f "$c" ]; then tarball="$c"; break; fi
done
if [ -z "$tarball" ]; then
  echo "error: no RustSec advisory database snapshot: set FLEETWATCH_ADVISORY_DB to a rustsec-advisory-db.tar.gz" >&2
  echo "       (or put one at $(cd .. && pwd)/shared/ or /work/shared/); how to make one: docs/release.md" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/db" "$work/canary"
tar -xzf "$tarball" -C "$work/db"
[ -d "$work/db/$name/crates" ] && git -C "$work/db/$name" rev-parse -q --verify HEAD >/dev/null \
  || { echo "error: $tarball does not hold a git checkout of the advisory database in $name/" >&2; exit 1; }
echo "advisory database: $tarball (commit $(git -C "$work/db/$name" log -1 --format='%h, %cs'))"

# The canary: a made-up advisory (placeholder-free id, every version affected) for tokio.
cp -a "$work/db/$name" "$work/canary/$name"
cat > "$work/canary/$name/crates/tokio/RUSTSEC-2099-9999.md" <<'MD'
```toml
[advisory]
id = "RUSTSEC-2099-9999"
package = "tokio"
date = "2099-01-01"
url = "https://example.invalid/fleetwatch-canary"
categories = ["memory-corruption"]

[versions]
patched = [">= 99.0.0"]
```

# fleetwatch's canary: scripts/advisories.sh checks that cargo-deny reads the database
MD
if FLEETWATCH_ADVISORY_DBS="$work/canary" "$deny" --offline check advisories >"$work/canary.log" 2>&1; then
  echo "error: cargo-deny passed although the canary advisory RUSTSEC-2099-9999 matches tokio: it does not read the database" >&2
  tail -20 "$work/canary.log" >&2
  exit 1
fi
grep -q RUSTSEC-2099-9999 "$work/canary.log" || {
  echo "error: cargo-deny failed on the canary database without reporting the canary advisory:" >&2
  tail -20 "$work/canary.log" >&2
  exit 1
}

FLEETWATCH_ADVISORY_DBS="$work/db" "$deny" --offline check advisories
