#!/usr/bin/env python3
"""The lifecycle operator's memory with many module versions known by digest (issue 28).

Pushes N module artifacts of about SIZE bytes each (a CustomResourceDefinition of that size
and a manager Deployment) to Debian's docker-registry on loopback, then, RUNS times, with
fresh `fleetwatch sim` clusters (a control plane and one runtime):

  1. starts `fleetwatch lifecycle --artifact-cache DIR` with no template: RSS `idle`;
  2. applies the N ModuleTemplates (by digest) and their ModuleReleaseMetas: RSS `known`;
  3. applies a Runtime with INSTALL of the modules: their artifacts are pulled, cached and
     applied; once the Runtime is Ready: RSS `installed` (and the peak while installing).

Prints each run and the medians of `known - idle` (what templates known by digest add) and
`installed - idle`. VmRSS from /proc; the binary is whatever --bin names (a debug build by
default: the heap is what counts, the code is larger than a release build's).

    python3 scripts/artifact-rss.py [--bin target/debug/fleetwatch] [--modules 200] [--size 1048576]
        [--install 100] [--runs 3] [--work DIR]

--work DIR keeps the registry's storage and the templates there, and reuses them when run
again with the same DIR (pushing 200 MiB takes minutes).
"""

import argparse
import concurrent.futures
import json
import os
import shutil
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


def wait_port(port, proc, what):
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not listen")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def crd(i, size):
    props = {}
    desc = "A field of the widget, described at length so the schema is large. " * 3
    n = 0
    while len(props) * (len(desc) + 60) < size:
        props[f"field{n:05}"] = {"type": "string", "description": f"{desc}{n}"}
        n += 1
    group = f"m{i:03}.example.com"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": props}}}}}],
        },
    }


def kubectl(kc, args, stdin=None):
    subprocess.run(["kubectl", "--kubeconfig", kc, *args], input=stdin, text=True, check=True,
                   stdout=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.environ.get("FLEETWATCH_BIN", "target/debug/fleetwatch"))
    ap.add_argument("--modules", type=int, default=200)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--install", type=int, default=100)
    ap.add_argument("--work")
    args = ap.parse_args()
    fw = os.path.abspath(args.bin)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = args.work or tempfile.mkdtemp(prefix="artifact-rss-")
    os.makedirs(work, exist_ok=True)
    saved = f"{work}/templates-{args.modules}-{args.size}.yaml"
    procs = []
    try:
        port = int(open(f"{work}/port").read()) if os.path.exists(saved) else free_port()
        with open(f"{work}/port", "w") as f:
            f.write(str(port))
        host = f"127.0.0.1:{port}"
        with open(f"{work}/registry.yml", "w") as f:
            f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/registry\n"
                    f"http:\n  addr: {host}\n")
        reg = subprocess.Popen(["docker-registry", "serve", f"{work}/registry.yml"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        procs.append(reg)
        wait_port(port, reg, "docker-registry")

        templates = open(saved).read().split("\n---\n") if os.path.exists(saved) else []
        t0 = time.time()
        def package(i):
            d = f"{work}/m{i:03}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/a-crd.json", "w") as f:
                json.dump(crd(i, args.size), f)
            with open(f"{d}/b-manager.json", "w") as f:
                json.dump({"apiVersion": "apps/v1", "kind": "Deployment",
                           "metadata": {"name": f"m{i:03}-manager", "namespace": "modules"},
                           "spec": {"selector": {"matchLabels": {"app": f"m{i:03}"}},
                                    "template": {"metadata": {"labels": {"app": f"m{i:03}"}},
                                                 "spec": {"containers": [{"name": "m", "image": "example.com/m:1"}]}}}}, f)
            with open(f"{d}/0-namespace.json", "w") as f:
                json.dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "modules"}}, f)
            out = subprocess.run([fw, "module", "package", "--dir", d, "--name", f"m{i:03}", "--version", "1.0.0",
                                  "--manager", f"modules/m{i:03}-manager", "--push", f"{host}/modules/m{i:03}:1.0.0",
                                  "--namespace", "kcp"], capture_output=True, text=True)
            shutil.rmtree(d)
            if out.returncode != 0:
                raise RuntimeError(f"package m{i:03}: {out.stderr}")
            return out.stdout

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            templates += list(pool.map(package, range(len(templates), args.modules)))
        with open(saved, "w") as f:
            f.write("\n---\n".join(templates))
        print(f"{args.modules} artifacts of {args.size} bytes in the registry ({time.time() - t0:.0f}s)", flush=True)
        metas = "".join(
            "---\n" + json.dumps({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
                                  "metadata": {"name": f"m{i:03}", "namespace": "kcp"},
                                  "spec": {"moduleName": f"m{i:03}",
                                           "channels": [{"channel": "regular", "version": "1.0.0"}]}}) + "\n"
            for i in range(args.modules))
        all_templates = "".join("---\n" + t for t in templates)

        results = []
        for run in range(args.runs):
            rdir = f"{work}/run{run}"
            shutil.rmtree(rdir, ignore_errors=True)
            os.makedirs(rdir)
            sims = {}
            for name in ("cp", "rt"):
                kc = f"{rdir}/{name}.kubeconfig"
                p = subprocess.Popen([fw, "sim", "--listen", "127.0.0.1:0", "--kubeconfig-out", kc],
                                     stdout=subprocess.DEVNULL, stderr=open(f"{rdir}/{name}.log", "w"))
                procs.append(p)
                sims[name] = kc
            for kc in sims.values():
                deadline = time.time() + 30
                while not os.path.exists(kc) and time.time() < deadline:
                    time.sleep(0.05)
            cp = sims["cp"]
            kubectl(cp, ["apply", "-f", f"{repo}/deploy/crds"])
            kubectl(cp, ["create", "namespace", "kcp"])
            with open(sims["rt"]) as f:
                rt_config = f.read()
            kubectl(cp, ["apply", "-f", "-"], json.dumps({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "rt", "namespace": "kcp"}, "stringData": {"config": rt_config}}))
            lc = subprocess.Popen([fw, "lifecycle", "--control-plane-kubeconfig", cp, "--leader-elect=false",
                                   "--resync", "0", "--artifact-cache", f"{rdir}/cache"],
                                  stdout=subprocess.DEVNULL, stderr=open(f"{rdir}/lifecycle.log", "w"),
                                  env={**os.environ, "FLEETWATCH_LOG": "warn"})
            procs.append(lc)
            time.sleep(5)  # settle: watches listed, nothing to do
            idle = rss_kib(lc.pid)
            kubectl(cp, ["apply", "-f", "-"], all_templates)
            kubectl(cp, ["apply", "-f", "-"], metas)
            time.sleep(5)  # the templates reach the operator's store (nothing is pulled)
            known = rss_kib(lc.pid)
            t1 = time.time()
            modules = [{"name": f"m{i:03}"} for i in range(args.install)]
            kubectl(cp, ["apply", "-f", "-"], json.dumps({"apiVersion": "operator.fleetwatch.dev/v1alpha1",
                    "kind": "Runtime", "metadata": {"name": "rt", "namespace": "kcp"},
                    "spec": {"kubeconfigSecret": {"name": "rt"}, "modules": modules}}))
            ready = None
            peak = 0
            while time.time() - t1 < 900:
                peak = max(peak, rss_kib(lc.pid))
                out = subprocess.run(["kubectl", "--kubeconfig", cp, "get", "runtime", "rt", "-n", "kcp",
                                      "-o", "jsonpath={.status.modulesReady}"], capture_output=True, text=True)
                if out.stdout == f"{args.install}/{args.install}":
                    ready = time.time() - t1
                    break
                time.sleep(1)
            if ready is None:
                sys.exit(f"run {run}: the Runtime did not get ready; see {rdir}/lifecycle.log")
            time.sleep(3)
            installed = rss_kib(lc.pid)
            peak = max(peak, installed)
            cache = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(f"{rdir}/cache") for f in fs)
            r = {"idle_mib": idle / 1024, "known_mib": known / 1024, "installed_mib": installed / 1024,
                 "peak_mib": peak / 1024, "install_s": ready, "disk_cache_mib": cache / 2**20}
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.1f}" for k, v in r.items()), flush=True)
            results.append(r)
            for p in procs[1:]:
                p.kill()
                p.wait()
            del procs[1:]
        med = lambda f: statistics.median(f(x) for x in results)  # noqa: E731
        print(f"median of {args.runs}: templates known by digest add "
              f"{med(lambda x: x['known_mib'] - x['idle_mib']):.1f} MiB (idle {med(lambda x: x['idle_mib']):.1f} MiB); "
              f"{args.install} installed add {med(lambda x: x['installed_mib'] - x['idle_mib']):.1f} MiB "
              f"(peak {med(lambda x: x['peak_mib']):.1f} MiB RSS, {med(lambda x: x['install_s']):.0f}s to install)")
    finally:
        for p in procs:
            p.kill()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
