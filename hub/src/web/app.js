// fleetwatch web view: the fleet overview at /, one cluster at /clusters/{id}.
// Live through server-sent events (/api/v1/overview/stream). Everything that comes from
// outside (cluster ids, messages, versions) is put into the page as text, never as HTML.
"use strict";

(function () {
  const main = document.getElementById("main");
  const live = document.getElementById("live");
  const crumb = document.getElementById("crumb");
  const clusterPrefix = "/clusters/";
  const clusterId = location.pathname.startsWith(clusterPrefix)
    ? decodeURIComponent(location.pathname.slice(clusterPrefix.length))
    : null;

  // el("td", {class: "num"}, "text", child, ...): an element with attributes and children;
  // strings become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k.startsWith("data-")) e.dataset[k.slice(5).replace(/-([a-z])/g, (_, c) => c.toUpperCase())] = String(v);
      else e.setAttribute(k, String(v));
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  // A header takes its column's alignment (numbers right), read from the first row.
  function table(headers, rows, attrs) {
    const first = rows.length ? [...rows[0].children] : [];
    const th = (h, i) => el("th", { class: first[i] && first[i].classList.contains("num") ? "num" : null }, h);
    // Row headers only (the facts table): no empty header row above them.
    const head = headers.some((h) => h) ? el("thead", {}, el("tr", {}, ...headers.map(th))) : null;
    return el("table", attrs, head, el("tbody", {}, ...rows));
  }

  function ago(time) {
    if (!time) return "never";
    const s = Math.max(0, (Date.now() - Date.parse(time)) / 1000);
    if (s < 1) return "just now";
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " d ago";
  }

  function connectedBadge(connected) {
    return el("span", { class: "badge " + (connected ? "state-ok" : "state-bad"), "data-role": "connection" }, connected ? "connected" : "disconnected");
  }

  function stateClass(state) {
    if (state === "Ready") return "state-ok";
    if (state === "Error") return "state-bad";
    if (state === "Warning") return "state-warn";
    return "";
  }

  function card(value, label, id) {
    return el("div", { class: "card", id: id }, el("div", { class: "value" }, value), el("div", { class: "label" }, label));
  }

  function windowStart(w) {
    if (!w) return "";
    const begin = String(w).split("/")[0];
    const t = Date.parse(begin);
    return isNaN(t) ? begin : new Date(t).toISOString().replace(":00.000Z", "Z").replace("T", " ");
  }

  function moduleCell(m) {
    const text = m.refusedDowngrade
      ? "refused: downgrade " + (m.running || "-") + " → " + m.refusedDowngrade
      : (m.running || "-") + (m.pendingUpgrade ? " → " + m.pendingUpgrade : "");
    const parts = [el("span", { class: stateClass(m.state) }, m.name + " " + text + " " + m.state)];
    if (m.pendingUpgrade && m.nextMaintenanceWindow) parts.push(el("div", { class: "muted" }, "waits for " + windowStart(m.nextMaintenanceWindow)));
    if (m.message) parts.push(el("div", { class: "muted" }, m.message));
    if (m.configInvalid && m.configInvalid.length) parts.push(el("div", { class: "state-bad" }, "configuration invalid: " + m.configInvalid.join("; ")));
    return el("div", { "data-module": m.name, "data-state": m.state }, ...parts);
  }

  function byState(counts) {
    return Object.entries(counts || {}).map(([s, n]) => el("span", { class: "badge " + stateClass(s) }, s + " " + n));
  }

  function runtimesSection(runtimes, onlyCluster) {
    const out = [];
    if (!runtimes || !runtimes.configured) {
      if (!onlyCluster) out.push(el("p", { class: "note" }, "Modules: the hub reads no control plane (start it with --control-plane-kubeconfig)."));
      return out;
    }
    const items = (runtimes.items || []).filter((r) => !onlyCluster || r.cluster === onlyCluster);
    out.push(el("h2", {}, onlyCluster ? "Modules" : "Modules by runtime"));
    if (runtimes.error) out.push(el("p", { class: "state-bad" }, "Control plane: " + runtimes.error));
    if (items.length === 0) {
      out.push(el("p", { class: "note" }, runtimes.updated ? "No Runtime." : "Reading the control plane…"));
      return out;
    }
    const rows = items.map((r) =>
      el("tr", { "data-runtime": r.runtime },
        el("td", {}, r.runtime),
        el("td", {}, onlyCluster ? r.cluster : el("a", { href: clusterPrefix + encodeURIComponent(r.cluster) }, r.cluster)),
        el("td", { class: stateClass(r.state) }, r.state || "-"),
        el("td", {}, ...byState(r.modulesByState)),
        el("td", {}, ...(r.modules || []).map(moduleCell))));
    out.push(table(["Runtime", "Cluster", "State", "Modules by state", "Modules (running → pending, window; refused downgrades)"], rows, { id: "runtimes" }));
    return out;
  }

  function subscriptionsSection(subs) {
    const rows = (subs || []).map((s) =>
      el("tr", { "data-subscriber": s.subscriber, "data-durable": s.durable || "" },
        el("td", {}, s.subscriber),
        el("td", {}, s.durable || "-"),
        el("td", {}, connectedBadge(s.connected)),
        el("td", { class: "num" }, s.cursor),
        el("td", { class: "num" }, s.lagRecords),
        el("td", { class: "num" }, Number(s.lagSeconds).toFixed(1) + " s")));
    return [el("h2", {}, "Subscribers"),
      rows.length ? table(["Subscriber", "Durable", "Connection", "Cursor", "Lag (records)", "Lag (age)"], rows, { id: "subscriptions" })
        : el("p", { class: "note" }, "No subscriber.")];
  }

  // What the hub made of each WatchConfig: refused ones (never pushed to agents) first, in red.
  function watchConfigsSection(wcs) {
    const items = (wcs && wcs.items) || [];
    const rows = items.map((w) =>
      el("tr", { "data-watchconfig": w.name, "data-accepted": w.accepted },
        el("td", {}, w.name || "-"),
        el("td", { class: "muted" }, w.source),
        el("td", {}, w.accepted ? el("span", { class: "state-ok" }, "accepted")
          : el("span", { class: "state-bad" }, "refused: " + w.reason)),
        el("td", {}, w.message || ""),
        el("td", { class: "num" }, w.clusters)));
    const out = [el("h2", {}, "Watch configurations")];
    if (wcs && wcs.refused) {
      out.push(el("p", { class: "state-bad", id: "watchconfigs-refused" },
        wcs.refused + (wcs.refused === 1 ? " WatchConfig is" : " WatchConfigs are") + " refused and not pushed to agents."));
    }
    out.push(rows.length ? table(["WatchConfig", "Source", "Accepted", "Message", "Clusters"], rows, { id: "watchconfigs" })
      : el("p", { class: "note" }, "No WatchConfig."));
    if (wcs && wcs.omitted) out.push(el("p", { class: "note" }, wcs.omitted + " more not shown (refused ones are listed first)."));
    return out;
  }

  function renderOverview(doc) {
    const t = doc.totals || {};
    const rows = (doc.clusters || []).map((c) =>
      el("tr", { "data-cluster": c.cluster, "data-connected": c.connected },
        el("td", {}, el("a", { href: clusterPrefix + encodeURIComponent(c.cluster) }, c.cluster)),
        el("td", {}, connectedBadge(c.connected)),
        el("td", { title: c.lastSeen || "" }, ago(c.lastSeen)),
        el("td", { class: "num" }, c.eventsPerSec),
        el("td", { class: "num" }, c.eventsReceived),
        el("td", {}, c.watchesRunning + " running",
          // Waiting for a kind nothing installed (a removed module) is healthy: muted, not red.
          c.watchesWaiting ? el("span", { class: "muted" }, ", " + c.watchesWaiting + " waiting for kind") : null,
          c.watchesFailed ? ", " : null,
          c.watchesFailed ? el("span", { class: "state-bad" }, c.watchesFailed + " failed") : null),
        el("td", { class: "muted" }, c.agentVersion || "")));
    const parts = [
      el("h1", {}, "Fleet"),
      el("div", { class: "cards" },
        card(t.clusters ?? 0, "clusters", "total-clusters"),
        card(t.connected ?? 0, "connected", "total-connected"),
        card(t.disconnected ?? 0, "disconnected", "total-disconnected"),
        card(t.eventsPerSec ?? 0, "events/s", "total-rate"),
        card(doc.ready ? "ready" : "not ready", "hub", "hub-ready")),
      el("h2", {}, "Clusters"),
      rows.length ? table(["Cluster", "Agent", "Last seen", "Events/s", "Events", "Watches", "Agent version"], rows, { id: "clusters" })
        : el("p", { class: "note" }, "No agent has connected yet."),
    ];
    if (doc.clustersOmitted) parts.push(el("p", { class: "note" }, doc.clustersOmitted + " more clusters not shown (connected ones are left out first)."));
    parts.push(...watchConfigsSection(doc.watchConfigs));
    parts.push(...subscriptionsSection(doc.subscriptions));
    parts.push(...runtimesSection(doc.runtimes, null));
    main.replaceChildren(...parts);
  }

  // A watch's phase colour: `waiting-for-kind` (nothing installed the kind) is not a failure.
  function watchPhaseClass(phase) {
    if (phase === "running") return "state-ok";
    if (phase === "starting" || phase === "waiting-for-kind") return "muted";
    return "state-bad";
  }

  function renderCluster(doc, c) {
    crumb.textContent = "/ " + clusterId;
    if (!c) {
      main.replaceChildren(el("h1", {}, clusterId), el("p", { class: "note", id: "unknown" }, "No agent of this cluster has connected to this hub since it started."));
      return;
    }
    const watches = (c.watches || []).map((w) =>
      el("tr", { "data-watch": w.name }, el("td", {}, w.name), el("td", { class: watchPhaseClass(w.phase) }, w.phase),
        el("td", { class: "num" }, w.objects ?? 0), el("td", { class: "muted" }, w.message || "")));
    const inventory = (c.inventory || []).map((m) =>
      el("tr", {}, el("td", {}, m.name), el("td", {}, m.version), el("td", { class: m.ready ? "state-ok" : "state-warn" }, m.ready ? "ready" : "not ready")));
    const events = (c.recentEvents || []).slice().reverse().map((e) =>
      el("tr", {}, el("td", { title: e.time }, ago(e.time)), el("td", { class: "num" }, e.seq), el("td", {}, e.type), el("td", { class: "mono" }, e.subject), el("td", {}, e.watch || "")));
    const facts = [
      ["Agent", connectedBadge(c.connected)],
      ["Last seen", ago(c.lastSeen) + (c.lastSeen ? " (" + c.lastSeen + ")" : "")],
      ["Agent version", c.agentVersion || "-"],
      ["Address", c.remote || "-"],
      ["Epoch / acked seq", (c.epoch ?? 0) + " / " + (c.ackedSeq ?? 0)],
      ["Events since hub start", c.eventsReceived ?? 0],
      ["Sessions", c.sessions ?? 0],
      ["Certificate", (c.certSerial || "-") + (c.certNotAfter ? " until " + c.certNotAfter : "")],
      ["Conflicts", (c.conflicts ?? 0) + (c.lastConflictFrom ? " (last from " + c.lastConflictFrom + ")" : "")],
    ];
    if (c.hub) facts.push(["Hub replica", c.hub]);
    main.replaceChildren(
      el("h1", { "data-cluster": c.cluster, "data-connected": c.connected }, c.cluster),
      table(["", ""], facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))), { id: "facts" }),
      el("h2", {}, "Watches"),
      watches.length ? table(["Watch", "Phase", "Objects", "Message"], watches, { id: "watches" }) : el("p", { class: "note" }, "No watch reported."),
      el("h2", {}, "Inventory"),
      inventory.length ? table(["Module", "Version", "Manager"], inventory, { id: "inventory" }) : el("p", { class: "note" }, "No module reported."),
      ...runtimesSection(lastOverview && lastOverview.runtimes, c.cluster),
      el("h2", {}, "Recent events"),
      events.length ? table(["When", "Seq", "Type", "Subject", "Watch"], events, { id: "recent" }) : el("p", { class: "note" }, "None since the hub started."));
  }

  let lastOverview = null;
  let fetching = false;

  async function refreshCluster() {
    if (fetching) return;
    fetching = true;
    try {
      const r = await fetch("/api/v1/clusters/" + encodeURIComponent(clusterId), { headers: { Accept: "application/json" } });
      if (r.status === 404) renderCluster(null, null);
      else if (r.ok) renderCluster(null, await r.json());
    } catch (e) {
      setLive("lost", "cannot read the cluster: " + e);
    } finally {
      fetching = false;
    }
  }

  function setLive(state, text) {
    live.dataset.state = state;
    live.textContent = text;
  }

  function onOverview(doc) {
    lastOverview = doc;
    document.body.dataset.updated = doc.time || "";
    setLive("live", "live · " + new Date(Date.parse(doc.time)).toLocaleTimeString());
    if (clusterId === null) renderOverview(doc);
    else refreshCluster();
  }

  const source = new EventSource("/api/v1/overview/stream");
  source.addEventListener("overview", (e) => {
    try {
      onOverview(JSON.parse(e.data));
    } catch (err) {
      setLive("lost", "bad update: " + err);
    }
  });
  source.onerror = () => setLive("lost", "disconnected from the hub, retrying…");
})();
