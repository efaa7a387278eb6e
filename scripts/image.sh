#!/usr/bin/env bash
# Builds fleetwatch's OCI image daemonlessly with buildah and smoke-tests it.
#
#   bash scripts/image.sh             build $TARGET/image/fleetwatch.oci.tar, then smoke-test it
#   bash scripts/image.sh --no-test   build only
#
# ($TARGET is $CARGO_TARGET_DIR, else target/.)  The image has the layout of the Dockerfile's
# runtime stage (distroless cc-debian12:nonroot), made from this machine's Debian files:
#   /usr/local/bin/fleetwatch      the release binary without the sandbox, its dependency list
#                                  embedded by cargo-auditable (pinned) for scanners:
#                                  `cargo auditable build --release --locked -p fleetwatch --no-default-features`
#   the glibc libraries it links   (what `ldd` lists: libc, libm, libgcc_s, the loader)
#   /etc/ssl/certs/ca-certificates.crt, /etc/passwd and /etc/group (root, nonroot 65532,
#   nobody), /etc/nsswitch.conf, /home/nonroot, /tmp (1777)
#   for scanners, as distroless has them: /etc/os-release, /etc/debian_version, and the dpkg
#   status (/var/lib/dpkg/status.d/NAME) and copyright of each Debian package those files
#   come from (scripts/os-packages.sh: libc6, libgcc-s1, ca-certificates, base-files)
# and nothing else: no shell, no package manager. It runs as 65532:65532; the labels are
# org.opencontainers.image.{version,revision,source,licenses,title,created}, created being the
# commit's time so that two builds of a commit differ only where the binary does.
#
# The smoke test: podman cannot run containers where the tests run (crun refuses cgroups in
# hybrid mode), so it runs the image's root filesystem itself, unpacked from the archive's
# layers: in a mount namespace of its own (`unshare --mount`) the root filesystem is
# bind-mounted read-only (a write to it is checked to fail), the certificates read-only and
# a data directory read-write, and `chroot --userspec=65532:65532` starts the hub from it as
# the image's user. An agent outside the image, with a synthetic source, connects over mutual
# TLS, and a `tail` subscriber outside must receive its event. `fleetwatch up` from the image
# must say that the sandbox is not in this build. Needs root (mount namespaces, chroot).
#
# buildah is Debian's package, pinned to the version below (apt checks it against the signed
# archive); it is installed when missing. Its storage is a temporary directory (vfs driver),
# removed afterwards: nothing is left in /var/lib/containers.
set -euo pipefail
cd "$(dirname "$0")/.."
buildah_version=1.28.2+ds1-3+deb12u1+b3
auditable_version=0.7.7
test=1
[ "${1:-}" = --no-test ] && test=0

target="${CARGO_TARGET_DIR:-target}"
out_dir="$target/image"
out="$out_dir/fleetwatch.oci.tar"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
source_url="$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -1)"
revision="$(git rev-parse HEAD)"
git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
created="$(git log -1 --format=%cI)"
[ -n "$version" ] && [ -n "$source_url" ] || { echo "error: no version or repository in Cargo.toml's [workspace.package]" >&2; exit 1; }

step() { echo "== image: $*"; }
fail() { echo "error: image: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root: the image's files are owned by root and 65532, and the smoke test needs mount namespaces and chroot"

# A buildah on PATH is used when it is the pinned upstream version; else apt installs the pin.
if ! { command -v buildah >/dev/null && buildah --version | grep -q "^buildah version ${buildah_version%%+*} "; }; then
  step "installing buildah $buildah_version (Debian)"
  apt-get update -qq && apt-get install -y -qq "buildah=$buildah_version" >/dev/null \
    || fail "cannot install buildah=$buildah_version from Debian (apt-cache policy buildah says which versions there are)"
fi

step "release binary without the sandbox (cargo auditable $auditable_version)"
auditable="$(bash scripts/cargo-tool.sh cargo-auditable "$auditable_version")"
PATH="$(dirname "$auditable"):$PATH" cargo auditable build --release --locked -p fleetwatch --no-default-features
bin="$target/release/fleetwatch"
[ -x "$bin" ] || fail "no $bin after the build"
# What scanners read (`syft`, `trivy`, `cargo audit bin`): the .dep-v0 section.
sections="$(readelf -S "$bin")"
grep -q '\.dep-v0' <<<"$sections" || fail "$bin has no .dep-v0 section: not built by cargo auditable"

work="$(mktemp -d)"
hub_pid=""
cleanup() {
  if [ -n "$hub_pid" ]; then kill "$hub_pid" 2>/dev/null || true; wait "$hub_pid" 2>/dev/null || true; fi
  # The vfs storage holds read-only copies; buildah's own cleanup is not needed, rm is enough.
  rm -rf "$work"
}
trap cleanup EXIT

step "root filesystem"
root="$work/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/home/nonroot" "$root/tmp"
install -m 0755 "$bin" "$root/usr/local/bin/fleetwatch"
# The libraries the binary links, at the paths the loader looks for them (dereferenced).
libs="$(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')"
[ -n "$libs" ] || fail "ldd lists no libraries for $bin (a static binary would need none: change this script)"
for lib in $libs; do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nonroot:x:65532:
EOF
echo "hosts: files dns" > "$root/etc/nsswitch.conf"
# What scanners need to see the copied glibc (Trivy, Grype and Syft read distroless' layout):
# the OS (/etc/os-release), and each package's dpkg status and copyright. The packages are
# the ones scripts/os-packages.sh finds (scripts/sbom.sh lists the same).
packages="$(bash scripts/os-packages.sh "$bin")"
cp -L /etc/os-release "$root/etc/os-release"
cp -L /etc/debian_version "$root/etc/debian_version"
mkdir -p "$root/var/lib/dpkg/status.d"
while read -r name _; do
  dpkg-query -s "$name" > "$root/var/lib/dpkg/status.d/$name"
  if [ -f "/usr/share/doc/$name/copyright" ]; then
    mkdir -p "$root/usr/share/doc/$name"
    cp -L "/usr/share/doc/$name/copyright" "$root/usr/share/doc/$name/copyright"
  fi
done <<<"$packages"
chown 65532:65532 "$root/home/nonroot"
chmod 0700 "$root/home/nonroot"
chmod 1777 "$root/tmp"
tar --sort=name --numeric-owner --mtime="$created" -C "$root" -cf "$work/rootfs.tar" .

step "buildah: scratch + rootfs, config, commit, push to $out"
start=$(date +%s)
b() { buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs "$@"; }
ctr="$(b from --quiet scratch)"
b add --quiet "$ctr" "$work/rootfs.tar" / >/dev/null
b config \
  --user 65532:65532 --workingdir / \
  --entrypoint '["/usr/local/bin/fleetwatch"]' --cmd --help \
  --port 7443/tcp --port 9090/tcp --port 9091/tcp \
  --label "org.opencontainers.image.title=fleetwatch" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=$source_url" \
  --label "org.opencontainers.image.licenses=Apache-2.0" \
  --label "org.opencontainers.image.created=$created" \
  "$ctr"
b commit --quiet --timestamp "$(git log -1 --format=%ct)" --rm "$ctr" "localhost/fleetwatch:$version" >/dev/null
mkdir -p "$out_dir"
rm -f "$out"
b push --quiet "localhost/fleetwatch:$version" "oci-archive:$out:fleetwatch:$version" >/dev/null
echo "wrote $out ($(du -h "$out" | cut -f1), binary $(du -h "$bin" | cut -f1); buildah $(( $(date +%s) - start )) s)"
[ "$test" = 1 ] || exit 0

step "smoke test: unpack the archive's layers, check the config"
unpacked="$work/unpacked"
mkdir -p "$work/oci" "$unpacked"
tar -xf "$out" -C "$work/oci"
python3 - "$work/oci" "$unpacked" "$version" "$revision" "$source_url" <<'PY'
import json, os, sys, tarfile
oci, dest, version, revision, source = sys.argv[1:]
def blob(digest):
    algo, hexd = digest.split(":", 1)
    return os.path.join(oci, "blobs", algo, hexd)
index = json.load(open(os.path.join(oci, "index.json")))
manifests = index["manifests"]
assert len(manifests) == 1, f"expected one manifest in index.json, got {len(manifests)}"
manifest = json.load(open(blob(manifests[0]["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
cfg = config["config"]
def check(what, got, want):
    if got != want:
        sys.exit(f"image config: {what} is {got!r}, expected {want!r}")
check("User", cfg.get("User"), "65532:65532")
check("Entrypoint", cfg.get("Entrypoint"), ["/usr/local/bin/fleetwatch"])
check("ExposedPorts", sorted(cfg.get("ExposedPorts", {})), ["7443/tcp", "9090/tcp", "9091/tcp"])
labels = cfg.get("Labels", {})
check("version label", labels.get("org.opencontainers.image.version"), version)
check("revision label", labels.get("org.opencontainers.image.revision"), revision)
check("source label", labels.get("org.opencontainers.image.source"), source)
for layer in manifest["layers"]:
    with tarfile.open(blob(layer["digest"])) as t:  # plain or gzip
        t.extractall(dest, numeric_owner=True)
PY
# Everything in the image, against what the Dockerfile's runtime stage has.
unexpected="$(cd "$unpacked" && find . -type f | sed 's|^\./|/|' | grep -v -x -e /usr/local/bin/fleetwatch \
  -e /etc/ssl/certs/ca-certificates.crt -e /etc/passwd -e /etc/group -e /etc/nsswitch.conf \
  -e /etc/os-release -e /etc/debian_version \
  $(for lib in $libs; do printf -- '-e %s ' "$lib"; done) \
  | grep -v -E '^/var/lib/dpkg/status\.d/[a-z0-9.+-]+$|^/usr/share/doc/[a-z0-9.+-]+/copyright$' || true)"
[ -z "$unexpected" ] || fail "files in the image that should not be there: $unexpected"
[ -z "$(cd "$unpacked" && find . -name sh -o -name bash -o -name busybox)" ] || fail "the image has a shell"
[ "$(stat -c %u "$unpacked/home/nonroot")" = 65532 ] || fail "/home/nonroot is not owned by 65532"
# Every package a copied file comes from has its dpkg status, at the version on this machine,
# as a scanner reads it; and the OS is named.
python3 - "$unpacked" <<PY || fail "the image's package metadata does not describe what it holds"
import os, sys
root = sys.argv[1]
want = {l.split()[0]: l.split()[1] for l in """$packages""".splitlines() if l.strip()}
for name, version in want.items():
    path = os.path.join(root, "var/lib/dpkg/status.d", name)
    fields = dict(l.split(": ", 1) for l in open(path).read().splitlines() if ": " in l and not l.startswith(" "))
    if fields.get("Package") != name or fields.get("Version") != version:
        sys.exit(f"{path}: Package {fields.get('Package')} Version {fields.get('Version')}, expected {name} {version}")
    if name == "libc6" and (fields.get("Source") or "").split(" ")[0] != "glibc":
        sys.exit(f"{path}: libc6's Source is {fields.get('Source')}, not glibc")
status_d = sorted(os.listdir(os.path.join(root, "var/lib/dpkg/status.d")))
if status_d != sorted(want):
    sys.exit(f"status.d holds {status_d}, expected {sorted(want)}")
if "libc6" not in want:
    sys.exit("libc6 is not among the image's packages, yet the binary links glibc")
osr = dict(l.split("=", 1) for l in open(os.path.join(root, "etc/os-release")).read().splitlines() if "=" in l)
if osr.get("ID") != "debian":
    sys.exit(f"/etc/os-release names {osr.get('ID')}, not debian")
print(f"{len(want)} Debian packages described: {', '.join(f'{n} {v}' for n, v in sorted(want.items()))}")
PY

# The certificates, made outside the image (with the same binary).
pki="$work/pki"
"$bin" certs init --dir "$pki" >/dev/null
"$bin" certs issue hub --dir "$pki" --dns localhost --ip 127.0.0.1 >/dev/null
"$bin" certs issue agent --dir "$pki" --cluster image-smoke >/dev/null
"$bin" certs issue subscriber --dir "$pki" --name image-smoke >/dev/null
# What the hub reads, readable by its user only (a Secret mounted with fsGroup, in a cluster).
tls="$work/tls"
mkdir -p "$tls" "$work/data"
cp "$pki/hub.crt" "$pki/hub.key" "$pki/ca.crt" "$tls/"
chown -R 65532:65532 "$tls" "$work/data"
chmod 0700 "$work/data"
# Mount points, as the container runtime would make them.
mkdir -p "$unpacked/etc/fleetwatch/tls" "$unpacked/var/lib/fleetwatch"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port="$(free_port)"
admin="$(free_port)"

# `unshare --mount --propagation private -- bash -euc "$in_image" in_image ROOT TLS DATA ARGS...`
# runs ARGS from the image, as 65532:65532 with the image's root read-only, the certificates
# read-only and the data directory writable. Each step execs the next (unshare, bash, chroot,
# the binary), so the PID of the command is the PID of the process from the image.
in_image='
  root="$1" tls="$2" data="$3"; shift 3
  mount --bind "$root" "$root"
  mount --bind "$tls" "$root/etc/fleetwatch/tls" && mount -o remount,bind,ro "$root/etc/fleetwatch/tls"
  mount --bind "$data" "$root/var/lib/fleetwatch"
  mount -o remount,bind,ro "$root"
  if touch "$root/usr/local/bin/x" 2>/dev/null; then echo "error: the image root is writable" >&2; exit 1; fi
  if touch "$root/etc/fleetwatch/tls/x" 2>/dev/null; then echo "error: the certificates are writable" >&2; exit 1; fi
  exec chroot --userspec=65532:65532 --groups=65532 "$root" "$@"
'

step "smoke test: \`fleetwatch up\` from the image says the sandbox is not in it"
if unshare --mount --propagation private -- bash -euc "$in_image" in_image "$unpacked" "$tls" "$work/data" \
  /usr/local/bin/fleetwatch up >"$work/up.out" 2>&1; then fail "\`fleetwatch up\` succeeded in the image"; fi
grep -q "without the \`sandbox\` feature" "$work/up.out" || { cat "$work/up.out" >&2; fail "\`fleetwatch up\` in the image did not say how to get the sandbox"; }

step "smoke test: the hub from the image (UID 65532, read-only root) on 127.0.0.1:$port"
unshare --mount --propagation private -- bash -euc "$in_image" in_image "$unpacked" "$tls" "$work/data" \
  /usr/local/bin/fleetwatch hub --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
  --cert /etc/fleetwatch/tls/hub.crt --key /etc/fleetwatch/tls/hub.key --client-ca /etc/fleetwatch/tls/ca.crt \
  --data-dir /var/lib/fleetwatch >"$work/hub.out" 2>"$work/hub.log" &
hub_pid=$!
deadline=$(( $(date +%s) + 60 ))
until curl -fsS "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; do
  kill -0 "$hub_pid" 2>/dev/null || { cat "$work/hub.log" >&2; fail "the hub from the image exited"; }
  [ "$(date +%s)" -lt "$deadline" ] || { cat "$work/hub.log" >&2; fail "the hub from the image was not ready within 60 s"; }
  sleep 0.2
done
[ "$(stat -c %u /proc/$hub_pid)" = 65532 ] || fail "the hub does not run as UID 65532"
[ -n "$(ls -A "$work/data")" ] || fail "the hub wrote nothing in its data directory"

step "smoke test: an agent outside the image delivers an event, a subscriber receives it"
"$bin" agent --hub "wss://localhost:$port" --retry-first-connect --source synthetic:objects=1,rate=10 \
  --cert "$pki/agent-image-smoke.crt" --key "$pki/agent-image-smoke.key" --ca "$pki/ca.crt" \
  >/dev/null 2>"$work/agent.log" &
agent_pid=$!
if ! timeout 60 "$bin" tail --hub "wss://localhost:$port" --from earliest --count 1 \
  --cert "$pki/subscriber-image-smoke.crt" --key "$pki/subscriber-image-smoke.key" --ca "$pki/ca.crt" \
  >"$work/event.json" 2>"$work/tail.log"; then
  kill "$agent_pid" 2>/dev/null || true
  cat "$work/tail.log" "$work/agent.log" "$work/hub.log" >&2
  fail "no event from the agent through the hub in the image within 60 s"
fi
kill "$agent_pid" 2>/dev/null || true
wait "$agent_pid" 2>/dev/null || true
# `tail` prints resync markers and CloudEvents; --count 1 stops after the first event.
python3 - "$work/event.json" <<'PY' || fail "no CloudEvent from cluster image-smoke in what tail printed"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
events = [e for e in lines if e.get("specversion") == "1.0" and e.get("source") == "/clusters/image-smoke"]
if not events:
    sys.exit(f"tail printed {lines}")
print(f"smoke test passed: event {events[0]['id']} ({events[0]['type']}) from the agent through the hub in the image")
PY
