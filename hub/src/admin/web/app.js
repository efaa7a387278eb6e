// fleetwatch web view: the fleet overview at /, one cluster at /clusters/{id}.
// Live through server-sent events (/api/v1/overview/stream: counts and changes); the lists
// are read a page at a time (/api/v1/clusters?limit=…&order=problems), so the page stays
// fast at any fleet size. Everything that comes from
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

  // Clusters per page (`?limit=N` in the address, 1 to 500): the page renders these rows
  // only, whatever the fleet's size.
  const PAGE = Math.min(500, Math.max(1, parseInt(new URLSearchParams(location.search).get("limit"), 10) || 50));
  // Least time between two reads of the lists while changes stream in.
  const REFRESH_MS = 500;
  // While only the counters move (events, last seen; the fleet's rate changes every second),
  // the lists are read again this often: at 50,000 clusters each read is a pass over the
  // fleet on the hub, and a page reading twice a second kept a replica's core busy.
  const COUNTERS_MS = 5000;
  const view = { q: "", tokens: [""], counts: null, countsKey: null };

  function watchCounts(c) {
    const ws = c.watches || [];
    const running = ws.filter((w) => w.phase === "running").length;
    const waiting = ws.filter((w) => w.phase === "waiting-for-kind").length;
    const failed = ws.filter((w) => !["running", "starting", "waiting-for-kind"].includes(w.phase)).length;
    return { running, waiting, failed };
  }

  function modulesNotReady(c) {
    return (c.inventory || []).filter((m) => !m.ready).length;
  }

  function clusterRow(c) {
    const w = watchCounts(c);
    const notReady = modulesNotReady(c);
    return el("tr", { "data-cluster": c.cluster, "data-connected": c.connected },
      el("td", {}, el("a", { href: clusterPrefix + encodeURIComponent(c.cluster) }, c.cluster)),
      el("td", {}, connectedBadge(c.connected)),
      el("td", { title: c.lastSeen || "" }, ago(c.lastSeen)),
      el("td", { class: "num" }, c.eventsReceived ?? 0),
      el("td", {}, w.running + " running",
        // Waiting for a kind nothing installed (a removed module) is healthy: muted, not red.
        w.waiting ? el("span", { class: "muted" }, ", " + w.waiting + " waiting for kind") : null,
        w.failed ? ", " : null,
        w.failed ? el("span", { class: "state-bad" }, w.failed + " failed") : null),
      el("td", {}, notReady ? el("span", { class: "state-warn" }, notReady + " not ready") : (c.inventory || []).length + " ready"),
      el("td", { class: "muted" }, c.agentVersion || ""));
  }

  // The page's frame, built once: counts, the search box and pager, and a place per section.
  function overviewFrame() {
    const search = el("input", { id: "search", type: "search", placeholder: "Search clusters and runtimes", "aria-label": "Search" });
    search.addEventListener("input", () => {
      clearTimeout(search.timer);
      search.timer = setTimeout(() => { view.q = search.value.trim(); view.tokens = [""]; refresh(true); }, 250);
    });
    const prev = el("button", { id: "prev", type: "button" }, "← previous");
    const next = el("button", { id: "next", type: "button" }, "next →");
    prev.addEventListener("click", () => { if (view.tokens.length > 1) { view.tokens.pop(); refresh(true); } });
    next.addEventListener("click", () => { if (view.nextToken) { view.tokens.push(view.nextToken); refresh(true); } });
    main.replaceChildren(
      el("h1", {}, "Fleet"),
      el("div", { class: "cards", id: "cards" }),
      el("h2", {}, "Clusters"),
      el("div", { class: "tools" }, search, prev, next, el("span", { id: "page-info", class: "muted" })),
      el("p", { class: "note" }, "Problems first: disconnected, then failing watches, then modules not ready."),
      el("div", { id: "clusters-section" }),
      el("div", { id: "watchconfigs-section" }),
      el("div", { id: "subscriptions-section" }),
      el("div", { id: "runtimes-section" }));
  }

  function renderCounts(t) {
    const cards = document.getElementById("cards");
    if (!cards) return;
    cards.replaceChildren(
      card(t.clusters ?? 0, "clusters", "total-clusters"),
      card(t.connected ?? 0, "connected", "total-connected"),
      card(t.disconnected ?? 0, "disconnected", "total-disconnected"),
      card(t.watchesFailing ?? 0, "failing watches", "total-failing"),
      card(t.modulesNotReady ?? 0, "modules not ready", "total-not-ready"),
      card(t.eventsPerSec ?? 0, "events/s", "total-rate"),
      card(t.ready ? "ready" : "not ready", "hub", "hub-ready"));
  }

  function renderClusters(doc) {
    const rows = (doc.clusters || []).map(clusterRow);
    const meta = doc.metadata || {};
    view.nextToken = meta.continue || null;
    const first = (view.tokens.length - 1) * PAGE;
    const shown = rows.length ? (first + 1) + "–" + (first + rows.length) : "0";
    const total = view.q ? (first + rows.length + (meta.remainingItemCount || 0)) + " matching" : (view.counts ? view.counts.clusters : "?") + "";
    document.getElementById("page-info").textContent = shown + " of " + total;
    document.getElementById("prev").disabled = view.tokens.length <= 1;
    document.getElementById("next").disabled = !view.nextToken;
    document.getElementById("clusters-section").replaceChildren(rows.length
      ? table(["Cluster", "Agent", "Last seen", "Events", "Watches", "Modules", "Agent version"], rows, { id: "clusters" })
      : el("p", { class: "note" }, view.q ? "No cluster matches." : "No agent has connected yet."));
    if (!performance.getEntriesByName("clusters-rendered").length) performance.mark("clusters-rendered");
  }

  async function getJson(path) {
    const r = await fetch(path, { headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  // Reads the current page of clusters and the other sections again.
  async function loadOverview() {
    const token = view.tokens[view.tokens.length - 1];
    const qs = "limit=" + PAGE + "&order=problems" + (view.q ? "&q=" + encodeURIComponent(view.q) : "");
    // All four asked at once; the clusters drawn as soon as they come (on a busy hub of
    // 50,000 clusters each answer takes its while: the page must not wait for the slowest).
    const clusters = getJson("/api/v1/clusters?" + qs + (token ? "&continue=" + encodeURIComponent(token) : ""));
    const rest = Promise.all([getJson("/api/v1/watchconfigs"), getJson("/api/v1/subscriptions"), getJson("/api/v1/runtimes?" + qs)]);
    rest.catch(() => {}); // awaited below; not unhandled if the clusters fail first
    renderClusters(await clusters);
    const [wcs, subs, runtimes] = await rest;
    const wc = wcs.watchConfigs || [];
    document.getElementById("watchconfigs-section").replaceChildren(...watchConfigsSection({ items: wc, refused: wcs.refused }));
    document.getElementById("subscriptions-section").replaceChildren(...subscriptionsSection(subs.subscriptions));
    const more = runtimes.metadata && runtimes.metadata.remainingItemCount;
    const rts = runtimesSection(runtimes, null);
    if (more) rts.push(el("p", { class: "note" }, more + " more runtimes not shown (unhealthy ones first; search to narrow)."));
    document.getElementById("runtimes-section").replaceChildren(...rts);
  }

  // One read at a time, at most one every REFRESH_MS while changes stream in; `now` (the
  // search box, the pager) skips the wait.
  const reader = { busy: false, again: false, last: 0, timer: null };
  async function refresh(now) {
    if (reader.busy) { reader.again = true; return; }
    const wait = now ? 0 : Math.max(0, reader.last + REFRESH_MS - Date.now());
    if (wait > 0) {
      if (!reader.timer) reader.timer = setTimeout(() => { reader.timer = null; refresh(true); }, wait);
      return;
    }
    reader.busy = true;
    reader.last = Date.now();
    try {
      if (clusterId === null) await loadOverview();
      else await refreshCluster();
    } catch (e) {
      setLive("lost", "cannot read the fleet: " + e);
    } finally {
      reader.busy = false;
      if (reader.again) { reader.again = false; refresh(false); }
    }
  }

  // A change of a cluster on this page shows at once; the list is read again (its order
  // may change) within REFRESH_MS.
  function applyChanges(changes) {
    for (const c of changes || []) {
      const row = document.querySelector('tr[data-cluster="' + CSS.escape(c.cluster) + '"]');
      if (!row || c.removed) continue;
      row.dataset.connected = c.connected;
      const cell = row.querySelector('[data-role="connection"]');
      if (cell) cell.replaceWith(connectedBadge(c.connected));
    }
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
      ...runtimesSection(clusterRuntimes, c.cluster),
      el("h2", {}, "Recent events"),
      events.length ? table(["When", "Seq", "Type", "Subject", "Watch"], events, { id: "recent" }) : el("p", { class: "note" }, "None since the hub started."));
  }

  async function refreshCluster() {
    const r = await fetch("/api/v1/clusters/" + encodeURIComponent(clusterId), { headers: { Accept: "application/json" } });
    if (r.status === 404) return renderCluster(null, null);
    if (!r.ok) throw new Error("HTTP " + r.status);
    const c = await r.json();
    // Its Runtimes: those whose name or cluster contains the id, then exactly its own.
    const rts = await getJson("/api/v1/runtimes?limit=100&q=" + encodeURIComponent(clusterId)).catch(() => null);
    clusterRuntimes = rts;
    renderCluster(null, c);
  }

  function setLive(state, text) {
    live.dataset.state = state;
    live.textContent = text;
  }

  let clusterRuntimes = null;

  function onEvent(doc, snapshot) {
    view.counts = doc.counts || {};
    document.body.dataset.updated = String(doc.seq ?? "");
    // UTC, like every other time the hub and the CLI show.
    setLive("live", "live · " + new Date().toISOString().slice(11, 19) + "Z");
    if (clusterId === null) {
      renderCounts(view.counts);
      if (!snapshot) applyChanges(doc.changes);
    }
    // A snapshot (first, or after changes were dropped) reads everything at once; a change
    // of a cluster's state or of a count (Runtimes, subscriptions, WatchConfigs...) within
    // REFRESH_MS; the counters alone within COUNTERS_MS.
    const key = JSON.stringify(Object.assign({}, view.counts, { eventsPerSec: null }));
    const changed = snapshot || (doc.changes || []).length > 0 || key !== view.countsKey;
    view.countsKey = key;
    if (changed || Date.now() - reader.last >= COUNTERS_MS) refresh(snapshot);
  }

  if (clusterId === null) overviewFrame();
  // A cluster's page changes (recent events) without the fleet's counts changing.
  else setInterval(() => refresh(false), 2000);
  // The first read does not wait for the stream's snapshot; the snapshot reads again once
  // this read is done (a change between the two is not missed).
  refresh(true);
  const source = new EventSource("/api/v1/overview/stream");
  for (const kind of ["snapshot", "delta"]) {
    source.addEventListener(kind, (e) => {
      try {
        onEvent(JSON.parse(e.data), kind === "snapshot");
      } catch (err) {
        setLive("lost", "bad update: " + err);
      }
    });
  }
  source.onerror = () => setLive("lost", "disconnected from the hub, retrying…");
})();
