#!/usr/bin/env python3
"""How soon a module that waits for something in its runtime cluster starts once it appears
(issue 43). Runs the sandbox (`fleetwatch up --clusters 1`, every component real, on
loopback), then RUNS times each:

  namespace   a module whose ServiceAccount goes into a namespace nobody created: it fails
              (Error, retried with backoff); once it failed 3 times in a row (its next try
              4 s or more away), the namespace is created in the runtime cluster and the
              time until the module is Ready is taken;
  dependency  a module requiring another that the Runtime does not list (Warning,
              WaitingForDependency); the dependency is added to the Runtime and the time
              until the dependent is Ready is taken (the dependency's install included).

Prints each time and the median. Times are read by polling the Runtime with kubectl (about
every 50 ms), so each is up to that much late. Release build by default.

    python3 scripts/unstuck-latency.py [--bin target/release/fleetwatch] [--runs 10] [--replicas 1]
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubectl(kc, *args, stdin=None):
    out = subprocess.run(["kubectl", "--kubeconfig", kc, *args], input=stdin, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {args}: {out.stderr}")
    return out.stdout


def apply(kc, obj):
    kubectl(kc, "apply", "--server-side", "--force-conflicts", "--field-manager", "bench", "-f", "-", stdin=json.dumps(obj))


REPLICAS = 1


def template(module, extra=(), requires=()):
    manifest = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"{module}-system"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": f"{module}-manager", "namespace": f"{module}-system",
                      "labels": {"operator.fleetwatch.dev/module": module, "app.kubernetes.io/version": "1.0.0"}},
         "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": module}},
                  "template": {"metadata": {"labels": {"app": module}},
                               "spec": {"containers": [{"name": "m", "image": "example/m:1"}]}}}},
        *extra,
    ]
    return {"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
            "metadata": {"name": f"{module}-1.0.0", "namespace": "kcp"},
            "spec": {"moduleName": module, "version": "1.0.0", "manifest": manifest,
                     "requires": [{"module": r} for r in requires],
                     "manager": {"apiVersion": "apps/v1", "kind": "Deployment",
                                 "namespace": f"{module}-system", "name": f"{module}-manager"}}}


def meta(module):
    return {"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
            "metadata": {"name": module, "namespace": "kcp"},
            "spec": {"moduleName": module, "channels": [{"channel": "regular", "version": "1.0.0"}]}}


def modules(cp):
    rt = json.loads(kubectl(cp, "-n", "kcp", "get", "runtime", "rt-1", "-o", "json"))
    return {m["name"]: m for m in rt.get("status", {}).get("modules", [])}


def wait(cp, what, cond, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ms = modules(cp)
        if cond(ms):
            return ms
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}: {json.dumps(modules(cp), indent=1)[:4000]}")


def add_modules(cp, names):
    rt = json.loads(kubectl(cp, "-n", "kcp", "get", "runtime", "rt-1", "-o", "json"))
    have = [m["name"] for m in rt["spec"]["modules"]]
    patch = {"spec": {"modules": [{"name": n} for n in have + [n for n in names if n not in have]]}}
    kubectl(cp, "-n", "kcp", "patch", "runtime", "rt-1", "--type", "merge", "-p", json.dumps(patch))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release/fleetwatch")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--replicas", type=int, default=1, help="replicas of each module's manager (the sim rolls them out at once)")
    args = ap.parse_args()
    global REPLICAS
    REPLICAS = args.replicas
    work = tempfile.mkdtemp(prefix="fw-unstuck-")
    sbx = os.path.join(work, "sbx")
    cmd = [args.bin, "up", "--clusters", "1", "--plain", "--dir", sbx, "--hub-port", "0", "--admin-port", "0",
           "--lifecycle-metrics-port", "0"]
    up = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(os.path.join(work, "up.stderr"), "w"), text=True)
    try:
        for line in up.stdout:
            if line.startswith("runtime=rt-1 ") and "state=Ready" in line:
                break
        cp = os.path.join(sbx, "control-plane.kubeconfig")
        rt = os.path.join(sbx, "rt-1.kubeconfig")
        ns_times, dep_times = [], []
        for i in range(args.runs):
            ghost, gns = f"ghost{i}", f"ghost{i}-ns"
            sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "g", "namespace": gns}}
            apply(cp, template(ghost, extra=[sa]))
            apply(cp, meta(ghost))
            add_modules(cp, [ghost])
            wait(cp, f"{ghost} failing 3 times", lambda ms: ms.get(ghost, {}).get("retry", {}).get("failures", 0) >= 3)
            t0 = time.monotonic()
            apply(rt, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": gns}})
            wait(cp, f"{ghost} Ready", lambda ms: ms.get(ghost, {}).get("state") == "Ready")
            ns_times.append(time.monotonic() - t0)
            base, app = f"base{i}", f"app{i}"
            apply(cp, template(base))
            apply(cp, meta(base))
            apply(cp, template(app, requires=[base]))
            apply(cp, meta(app))
            add_modules(cp, [app])
            wait(cp, f"{app} waiting for {base}", lambda ms: ms.get(app, {}).get("reason") == "WaitingForDependency")
            t0 = time.monotonic()
            add_modules(cp, [base])
            wait(cp, f"{app} Ready", lambda ms: ms.get(app, {}).get("state") == "Ready")
            dep_times.append(time.monotonic() - t0)
            print(f"run {i + 1}: namespace → Ready {ns_times[-1]:.2f} s, dependency added → dependent Ready {dep_times[-1]:.2f} s",
                  flush=True)
        print(f"median of {args.runs}: namespace → Ready {statistics.median(ns_times):.2f} s "
              f"(min {min(ns_times):.2f}, max {max(ns_times):.2f}); dependency added → dependent Ready "
              f"{statistics.median(dep_times):.2f} s (min {min(dep_times):.2f}, max {max(dep_times):.2f})")
    finally:
        up.send_signal(2)
        try:
            up.wait(timeout=20)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    sys.exit(main())
