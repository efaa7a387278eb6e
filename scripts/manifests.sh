#!/usr/bin/env bash
# Lints the Helm charts and renders the plain manifests in deploy/manifests/ from them with
# default values (plus the Namespace object and the CRDs, so `kubectl apply` works on an
# empty cluster; without the `helm test` Jobs, which only `helm test` runs). The hub's admin
# token Secret is not in them (as with the chart's defaults): create it before applying them
# (docs/deploy.md). The agent's hub address is the placeholder HUB (the chart requires one).
#   bash scripts/manifests.sh           rewrite deploy/manifests/*.yaml
#   bash scripts/manifests.sh --check   fail when they differ from what the charts render
set -euo pipefail
cd "$(dirname "$0")/.."
helm="$(bash scripts/helm.sh)"

render() { # chart release namespace [extra helm args]
  local chart="$1" release="$2" ns="$3"; shift 3
  printf '# Rendered from deploy/helm/%s with default values by scripts/manifests.sh; do not edit.\n' "$chart"
  printf '# helm template %s deploy/helm/%s --namespace %s --include-crds --skip-tests --set createNamespace=true%s\n' "$release" "$chart" "$ns" "${*:+ $*}"
  "$helm" template "$release" "deploy/helm/$chart" --namespace "$ns" --include-crds --skip-tests --set createNamespace=true "$@" \
    2> >(grep -v "found symbolic link in path" >&2)
}

# The agent chart needs the hub's address (it refuses to render without): the plain
# manifest names a placeholder HUB to replace (`fleetwatch agent-module --hub` does).
agent_hub=(--set 'hub.urls={wss://HUB:443}')
for chart in fleetwatch fleetwatch-agent; do
  set_args=()
  [ "$chart" = fleetwatch-agent ] && set_args=("${agent_hub[@]}")
  "$helm" lint --strict "deploy/helm/$chart" --namespace fleetwatch-system "${set_args[@]}" >/dev/null 2> >(grep -v "found symbolic link in path" >&2) \
    || { "$helm" lint --strict "deploy/helm/$chart" "${set_args[@]}"; exit 1; }
done

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# The admin token Secret: create it yourself (kubectl create secret generic
# fleetwatch-hub-admin-token -n fleetwatch-system --from-literal=token=$(openssl rand -hex 32)).
render fleetwatch fleetwatch fleetwatch-system > "$out/control-plane.yaml"
render fleetwatch-agent fleetwatch-agent fleetwatch-agent "${agent_hub[@]}" > "$out/agent.yaml"

if [ "${1:-}" = --check ]; then
  stale=0
  for f in control-plane.yaml agent.yaml; do
    if ! diff -u "deploy/manifests/$f" "$out/$f" > "$out/$f.diff"; then
      echo "deploy/manifests/$f is stale: run scripts/manifests.sh" >&2
      head -40 "$out/$f.diff" >&2
      stale=1
    fi
  done
  exit "$stale"
fi
mkdir -p deploy/manifests
cp "$out/control-plane.yaml" "$out/agent.yaml" deploy/manifests/
echo "wrote deploy/manifests/control-plane.yaml deploy/manifests/agent.yaml"
