#!/usr/bin/env bash
# The quickstart (docs/quickstart.md) as one script: every command in it, in order. Run from the
# repository root: `bash docs/quickstart.sh` (it works in ./quickstart and stops everything
# it started when it ends). docs/quickstart.md shows the same commands with explanations.
#
# Its ports and folder can be moved by environment variables, e.g. to run it beside a
# sandbox or a second quickstart (tests/e2e/readme.rs does); the defaults are docs/quickstart.md's:
#   QUICKSTART_HUB_PORT    the hub (wss)                       8443
#   QUICKSTART_ADMIN_PORT  the hub's admin endpoint (HTTP)     9190
#   QUICKSTART_CP_PORT     the simulated control plane         16443
#   QUICKSTART_RT_PORT     the simulated runtime cluster eu-1  16444
#   QUICKSTART_DIR         the folder it works in (removed and made afresh)  quickstart
set -euo pipefail
hub_port=${QUICKSTART_HUB_PORT:-8443} admin_port=${QUICKSTART_ADMIN_PORT:-9190}
cp_port=${QUICKSTART_CP_PORT:-16443} rt_port=${QUICKSTART_RT_PORT:-16444} dir=${QUICKSTART_DIR:-quickstart}
cargo build --release --quiet && export PATH=$PWD/target/release:$PATH
rm -rf "$dir" && mkdir "$dir" && cd "$dir"
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
wait_for() { for _ in $(seq 1 100); do eval "$1" >/dev/null 2>&1 && return 0; sleep 0.2; done; echo "timed out: $1" >&2; return 1; }

# 1. A CA and certificates (identities are SPIFFE URIs in them).
fleetwatch certs init --dir pki
fleetwatch certs issue hub --dir pki --dns localhost --ip 127.0.0.1
fleetwatch certs issue agent --dir pki --cluster eu-1
fleetwatch certs issue subscriber --dir pki --name lifecycle
fleetwatch certs issue subscriber --dir pki --name ops

# 2. Two simulated clusters (a real cluster: use its kubeconfig instead).
fleetwatch sim --listen 127.0.0.1:$cp_port --kubeconfig-out cp.kubeconfig > sim-cp.log 2>&1 &
fleetwatch sim --listen 127.0.0.1:$rt_port --kubeconfig-out eu-1.kubeconfig > sim-eu-1.log 2>&1 &
wait_for "kubectl --kubeconfig cp.kubeconfig get namespaces"
wait_for "kubectl --kubeconfig eu-1.kubeconfig get namespaces"
fleetwatch crds --dir crds
kubectl --kubeconfig cp.kubeconfig apply -f crds/
kubectl --kubeconfig cp.kubeconfig create namespace kcp --dry-run=client -o yaml | kubectl --kubeconfig cp.kubeconfig apply -f -

# 3. The hub (ports 8443/9190 by default: the sandbox uses 7443/9090), WatchConfigs from the control plane.
fleetwatch hub --listen 127.0.0.1:$hub_port --admin-listen 127.0.0.1:$admin_port --data-dir hub-data \
  --cert pki/hub.crt --key pki/hub.key --client-ca pki/ca.crt \
  --control-plane-kubeconfig cp.kubeconfig > hub.log 2>&1 &
wait_for "curl -sf 127.0.0.1:$admin_port/readyz"

# 4. The agent of eu-1, and the lifecycle operator.
fleetwatch agent --hub wss://127.0.0.1:$hub_port --cert pki/agent-eu-1.crt --key pki/agent-eu-1.key \
  --ca pki/ca.crt --kubeconfig eu-1.kubeconfig > agent-eu-1.log 2>&1 &
fleetwatch lifecycle --control-plane-kubeconfig cp.kubeconfig --hub wss://127.0.0.1:$hub_port \
  --cert pki/subscriber-lifecycle.crt --key pki/subscriber-lifecycle.key --ca pki/ca.crt > lifecycle.log 2>&1 &

# 5. The runtime's kubeconfig as a Secret, two modules (template + release channels each):
#    hello, which the Runtime lists, with a WatchConfig for its configuration, and echo,
#    which it does not (offered to eu-1's users), and the Runtime.
kubectl --kubeconfig cp.kubeconfig -n kcp create secret generic eu-1-kubeconfig \
  --from-file=config=eu-1.kubeconfig --dry-run=client -o yaml | kubectl --kubeconfig cp.kubeconfig apply -f -
kubectl --kubeconfig cp.kubeconfig apply -f - <<'EOF'
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: ModuleTemplate
metadata: {name: hello-1.0.0, namespace: kcp}
spec:
  moduleName: hello
  version: 1.0.0
  manifest:
  - {apiVersion: v1, kind: Namespace, metadata: {name: hello-system}}
  - apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: hello-manager
      namespace: hello-system
      labels: {operator.fleetwatch.dev/module: hello, app.kubernetes.io/version: 1.0.0}
    spec:
      replicas: 0        # a simulated cluster runs no pods; use 1 in a real cluster
      selector: {matchLabels: {app: hello-manager}}
      template:
        metadata: {labels: {app: hello-manager}}
        spec: {containers: [{name: manager, image: "example/hello-manager:1.0.0"}]}
  defaultConfig:
    apiVersion: v1
    kind: ConfigMap
    metadata: {name: hello-config, namespace: hello-system}
    data: {greeting: hello}
  manager: {apiVersion: apps/v1, kind: Deployment, namespace: hello-system, name: hello-manager}
---
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: ModuleReleaseMeta
metadata: {name: hello, namespace: kcp}
spec:
  moduleName: hello
  channels: [{channel: regular, version: 1.0.0}]
---
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: ModuleTemplate
metadata: {name: echo-1.0.0, namespace: kcp}
spec:
  moduleName: echo
  version: 1.0.0
  manifest:
  - {apiVersion: v1, kind: Namespace, metadata: {name: echo-system}}
  - apiVersion: apps/v1
    kind: Deployment
    metadata:
      name: echo-manager
      namespace: echo-system
      labels: {operator.fleetwatch.dev/module: echo, app.kubernetes.io/version: 1.0.0}
    spec:
      replicas: 0
      selector: {matchLabels: {app: echo-manager}}
      template:
        metadata: {labels: {app: echo-manager}}
        spec: {containers: [{name: manager, image: "example/echo-manager:1.0.0"}]}
  manager: {apiVersion: apps/v1, kind: Deployment, namespace: echo-system, name: echo-manager}
---
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: ModuleReleaseMeta
metadata: {name: echo, namespace: kcp}
spec:
  moduleName: echo
  channels: [{channel: regular, version: 1.0.0}]
---
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: WatchConfig
metadata: {name: hello-config}
spec:
  resource: {version: v1, kind: ConfigMap}
  namespace: hello-system
  fields: [data]
  subscriber: lifecycle
---
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: Runtime
metadata: {name: eu-1, namespace: kcp}
spec:
  clusterId: eu-1
  channel: regular
  kubeconfigSecret: {name: eu-1-kubeconfig}
  modules: [{name: hello}]
EOF

# 6. See it work.
wait_for "kubectl --kubeconfig cp.kubeconfig -n kcp get runtime eu-1 -o jsonpath='{.status.state}' | grep -qx Ready"
kubectl --kubeconfig cp.kubeconfig -n kcp get runtime eu-1 -o jsonpath='{.status.conditions[0].message}{"\n"}'
kubectl --kubeconfig eu-1.kubeconfig -n hello-system get deployment hello-manager -o jsonpath='{.metadata.labels.app\.kubernetes\.io/version}{"\n"}'
curl -s 127.0.0.1:$admin_port/api/v1/clusters
fleetwatch tail --hub wss://127.0.0.1:$hub_port --cert pki/subscriber-ops.crt --key pki/subscriber-ops.key \
  --ca pki/ca.crt --from earliest --count 3

# 7. eu-1's user enables echo in their own cluster (the operator installed the Module kind
#    there): the agent carries the object to the operator at once, and its status says what
#    happened. Deleting it removes echo, and returns once echo is gone.
wait_for "kubectl --kubeconfig eu-1.kubeconfig get modules"
kubectl --kubeconfig eu-1.kubeconfig apply -f - <<'EOF'
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: Module
metadata: {name: echo}
spec: {customResourcePolicy: CreateAndDelete}   # no channel: the Runtime's (regular)
EOF
wait_for "kubectl --kubeconfig eu-1.kubeconfig get module echo -o jsonpath='{.status.state}' | grep -qx Ready"
kubectl --kubeconfig eu-1.kubeconfig get modules            # echo (source user) beside hello (central)
kubectl --kubeconfig eu-1.kubeconfig describe module echo   # state, versions, channel, source, conditions
kubectl --kubeconfig eu-1.kubeconfig delete module echo --timeout=60s
kubectl --kubeconfig eu-1.kubeconfig get modules            # hello only
echo "quickstart: all steps worked"
