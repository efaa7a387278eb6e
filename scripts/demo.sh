#!/usr/bin/env bash
# The quickstart as one command: certificates, a hub, two agents and a tail, on loopback.
# Ctrl-C stops everything. (Becomes `fleetwatch up` once the sandbox exists.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p fleetwatch
FW=$PWD/target/release/fleetwatch
DIR=$(mktemp -d /tmp/fleetwatch-demo.XXXXXX)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; echo "demo state left in $DIR"; }
trap cleanup EXIT INT TERM

$FW certs init --dir "$DIR/pki"
$FW certs issue hub --dir "$DIR/pki" --dns localhost --ip 127.0.0.1
$FW certs issue agent --dir "$DIR/pki" --cluster eu-1
$FW certs issue agent --dir "$DIR/pki" --cluster us-1
$FW certs issue subscriber --dir "$DIR/pki" --name ops

$FW hub --listen 127.0.0.1:7443 --admin-listen 127.0.0.1:9090 --data-dir "$DIR/hub-data" \
  --cert "$DIR/pki/hub.crt" --key "$DIR/pki/hub.key" --client-ca "$DIR/pki/ca.crt" 2>"$DIR/hub.log" &
pids+=($!)
sleep 1
for c in eu-1 us-1; do
  $FW agent --hub wss://127.0.0.1:7443 --cert "$DIR/pki/agent-$c.crt" --key "$DIR/pki/agent-$c.key" \
    --ca "$DIR/pki/ca.crt" --source synthetic:objects=5,rate=2 2>"$DIR/agent-$c.log" &
  pids+=($!)
done
echo "hub admin: http://127.0.0.1:9090/api/v1/clusters   logs: $DIR/*.log"
echo "events (Ctrl-C to stop):"
$FW tail --hub wss://127.0.0.1:7443 --cert "$DIR/pki/subscriber-ops.crt" --key "$DIR/pki/subscriber-ops.key" \
  --ca "$DIR/pki/ca.crt" --name demo --from earliest
