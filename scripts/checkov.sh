#!/usr/bin/env bash
# Scans the Helm charts with Checkov (PyPI `checkov`, pinned, in a venv of its own): both
# charts rendered with default values and with their optional parts on (relays,
# cert-manager, NATS, monitoring, ...), `checkov --framework kubernetes` on the rendered
# manifests. Fails on any failed check that deploy/checkov.yaml does not skip (each skip
# there says why), and when checkov did not check every rendered workload (nothing passes
# unseen). A canary Pod (privileged, root) is scanned with them and must be caught, so a
# checkov that checks nothing, or a skip list that swallows everything, fails the scan.
#   bash scripts/checkov.sh        (scripts/test.sh runs it)
#
# Pinning: checkov and its whole dependency tree (96 packages) are pinned by version and
# sha256 in scripts/checkov-requirements.txt (`pip install --require-hashes --no-deps
# --only-binary :all:`), generated from a venv where `pip install checkov==$version`
# resolved them: `pip freeze`, `pip download --no-deps`, `pip hash` (docs/release.md,
# "Keeping the inputs current"). The wheels are those of CPython 3.11 on x86_64 Linux (the
# machines the tests run on); another interpreter fails the install here, saying so.
# The venv lives in $FLEETWATCH_TOOLS (default ~/.cache/fleetwatch-tools); a second run
# installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

version=3.3.30
tools="${FLEETWATCH_TOOLS:-$HOME/.cache/fleetwatch-tools}"
venv="$tools/checkov-$version"
lock=scripts/checkov-requirements.txt
stamp="$venv/.fleetwatch-lock-$(sha256sum "$lock" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  rm -rf "$venv"
  command -v python3 >/dev/null || { apt-get update -qq && apt-get install -y -qq python3 python3-venv; }
  python3 -m venv "$venv" >&2 || { apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv "$venv"; } >&2
  "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps --only-binary :all: -r "$lock" >&2 \
    || { echo "cannot install checkov==$version from $lock into $venv (CPython $(python3 -c 'import sys; print(sys.version.split()[0])'); the lock is for 3.11 on x86_64 Linux)" >&2; exit 1; }
  got="$("$venv/bin/checkov" --version)"
  [ "$got" = "$version" ] || { echo "checkov in $venv says $got, not $version" >&2; exit 1; }
  touch "$stamp"
fi
checkov="$venv/bin/checkov"

helm="$(bash scripts/helm.sh)"
out="$(mktemp -d)"
trap '[ -n "${KEEP:-}" ] || rm -rf "$out"' EXIT; [ -n "${KEEP:-}" ] && echo "$out" >&2
mkdir "$out/scan"

# A release install pins the image by digest (docs/release.md); so do these renders
# (CKV_K8S_43 checks it). The digests are made up: nothing is pulled.
digest="sha256:$(printf '%064d' 0 | tr 0 a)"
pinned=(--set "image.digest=$digest" --set "tests.image.digest=$digest")
render() { # file chart namespace [helm args]
  local file="$1" chart="$2" ns="$3"; shift 3
  "$helm" template "$chart" "deploy/helm/$chart" --namespace "$ns" "${pinned[@]}" "$@" \
    > "$out/scan/$file.yaml" 2> >(grep -v "found symbolic link in path" >&2)
}
render control-plane-default fleetwatch fleetwatch-system
render control-plane-all fleetwatch fleetwatch-system \
  --set hub.bus=nats --set hub.replicas=3 --set hub.nats.tlsSecretName=nats-tls --set hub.nats.credsSecretName=nats-creds \
  --set certificates.mode=cert-manager --set certificates.certManager.trustManager.enabled=true \
  --set 'certificates.certManager.trustManager.sources[0].secret.name=fleet-ca' \
  --set 'certificates.certManager.trustManager.sources[0].secret.key=ca.crt' \
  --set lifecycle.agentCASecret=fleetwatch-system/fleet-ca --set lifecycle.shards=2 \
  --set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true \
  --set monitoring.grafanaDashboard.enabled=true \
  --set relays.webhook.enabled=true --set relays.webhook.target=https://receiver.example/events \
  --set relays.webhook.hmacSecret.secretName=webhook-hmac --set relays.webhook.targetTLS.caSecretName=receiver-ca \
  --set relays.webhook.targetTLS.clientSecretName=receiver-client \
  --set relays.klm.enabled=true --set relays.klm.target=https://klm-listener.kcp-system.svc:8082 \
  --set relays.klm.xfccCASecretName=klm-xfcc-ca --set relays.klm.deadLetter.persistence.enabled=false
render agent-default fleetwatch-agent fleetwatch-agent --set 'hub.urls={wss://hub.example.org:443}'
render agent-cert-manager fleetwatch-agent fleetwatch-agent --set 'hub.urls={wss://hub.example.org:443}' --set certificate.mode=cert-manager --set clusterId=eu-1

# The canary: what every check list flags (privileged, root, no limits, no probes).
cat > "$out/scan/canary.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: checkov-canary, namespace: canary}
spec:
  containers:
    - name: c
      image: example/canary:latest
      securityContext: {privileged: true, runAsUser: 0}
YAML

start=$(date +%s)
"$checkov" --config-file deploy/checkov.yaml -d "$out/scan" -o json > "$out/result.json" 2> "$out/stderr" || true
"$venv/bin/python" - "$out" "$(( $(date +%s) - start ))" <<'PY'
import json, pathlib, sys
out, seconds = pathlib.Path(sys.argv[1]), sys.argv[2]
try:
    report = json.loads((out / "result.json").read_text())
except ValueError:
    sys.exit("checkov wrote no JSON report:\n" + (out / "stderr").read_text()[-3000:] + (out / "result.json").read_text()[-2000:])
reports = report if isinstance(report, list) else [report]
passed, failed, skipped = [], [], []
for r in reports:
    res = r.get("results", {})
    passed += res.get("passed_checks", [])
    failed += res.get("failed_checks", [])
    skipped += res.get("skipped_checks", [])
def short(c):  # "Kind.namespace.name" (checkov appends the pod labels for some checks)
    return ".".join(c["resource"].split(".")[:3])
canary = [c for c in failed if "checkov-canary" in c["resource"]]
real = [c for c in failed if "checkov-canary" not in c["resource"]]
problems = []
for c in real:
    problems.append(f'{c["check_id"]} {c["check_name"]}: {short(c)} ({pathlib.Path(c["file_path"]).name}; guideline {c.get("guideline") or "-"})')
if not any(c["check_id"] == "CKV_K8S_16" for c in canary):
    problems.append("the canary (a privileged Pod) was not caught (CKV_K8S_16): checkov did not check, or deploy/checkov.yaml skips too much")
# Every rendered workload was checked (a file checkov could not parse is not "passed").
import yaml  # checkov's own dependency, in its venv
seen = {short(c) for c in passed + failed + skipped}
for f in sorted((out / "scan").glob("*.yaml")):
    for doc in yaml.safe_load_all(f.read_text()):
        if not doc or doc.get("kind") not in ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod"):
            continue
        k = f'{doc["kind"]}.{doc["metadata"].get("namespace", "default")}.{doc["metadata"]["name"]}'
        if k not in seen:
            problems.append(f"{f.name}: {k} was not checked by checkov")
if problems:
    print("checkov: the charts fail these checks (fix the chart; skip only with a reason in deploy/checkov.yaml):", file=sys.stderr)
    for p in sorted(set(problems)):
        print("  " + p, file=sys.stderr)
    sys.exit(1)
print(f"checkov: {len(passed)} passed, 0 failed, checks {', '.join(yaml.safe_load(open('deploy/checkov.yaml'))['skip-check'])} skipped (deploy/checkov.yaml) on "
      f"{len(list((out / 'scan').glob('*.yaml'))) - 1} renders; canary caught ({len(canary)} checks); {seconds} s")
PY
