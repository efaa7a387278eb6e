//! `relay klm`: runtime-watcher's v2 listener contract, so Kyma lifecycle-manager (KLM) runs
//! unchanged with fleetwatch in place of its watcher.
//!
//! Each event becomes `POST {target}/v2/{component}/event` with `Content-Type:
//! application/json` and the body
//! `{"watched":{"namespace":…,"name":…},"watchedGvk":{"group":…,"version":…,"kind":…}}`
//! (nothing else; the listener refuses bodies over [`BODY_LIMIT`], so a larger one is
//! refused here, logged and counted, never sent). The runtime id (the cluster id of the
//! agent that sent the event) travels as the Subject CN of a certificate in
//! `X-Forwarded-Client-Cert` ([`crate::identity`]).
//!
//! The hub is acknowledged only after a 2xx; 5xx, a 4xx other than 400/413/422 (auth,
//! routing, 408, 429) and timeouts are retried with backoff; a 400/413/422 is logged once
//! per cause and skipped (counted).
//!
//! `resync-required` for a cluster becomes one request per object the relay knows for it
//! (objects it relayed since it started, deletes forgotten; at most
//! [`KlmConfig::max_known`] in all). When it knows none for the cluster (e.g. right after
//! the relay started), or dropped some past the bound, the fallback is one event for the
//! runtime's Kyma object ([`KlmConfig::fallback`], by default
//! `operator.kyma-project.io/v1beta2` `Kyma` `kyma-system/default`), which makes KLM
//! reconcile that runtime fully. `*` (every cluster) does so for every cluster the relay
//! knows.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use fleetwatch_client::sink::{Accepted, Sink, SinkError};
use fleetwatch_client::subscriber::Delivery;
use fleetwatch_protocol::event::Event;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::SaidOnce;
use crate::http::{Outcome, send};
use crate::identity::{IdentityMinter, XFCC_HEADER};
use crate::metrics::{Counter, Metrics, Refused};

/// The listener's request body limit (16 KiB).
pub const BODY_LIMIT: usize = 16 * 1024;
/// The contract version in the path.
pub const CONTRACT_VERSION: &str = "2";

/// `namespace` and `name` of the watched object (empty namespace: cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Watched {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// Group, version and kind of the watched object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Gvk {
    /// The group (empty for the core group).
    pub group: String,
    /// The version.
    pub version: String,
    /// The kind.
    pub kind: String,
}

/// The listener's request body.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchEvent {
    /// The object.
    pub watched: Watched,
    /// Its kind.
    pub watched_gvk: Gvk,
}

impl WatchEvent {
    /// The body, refused when over [`BODY_LIMIT`].
    pub fn body(&self) -> Result<Vec<u8>, usize> {
        let body = serde_json::to_vec(self).unwrap_or_default();
        if body.len() > BODY_LIMIT { Err(body.len()) } else { Ok(body) }
    }

    /// The default resync fallback: the runtime's Kyma object.
    pub fn kyma_default() -> Self {
        Self {
            watched: Watched { namespace: "kyma-system".into(), name: "default".into() },
            watched_gvk: Gvk {
                group: "operator.kyma-project.io".into(),
                version: "v1beta2".into(),
                kind: "Kyma".into(),
            },
        }
    }
}

/// The object an event is about, from its subject (`<apiVersion>/<kind>/<namespace>/<name>`,
/// `_` for no namespace); `None` for events about no Kubernetes object (inventory).
pub fn watch_event(e: &Event) -> Option<WatchEvent> {
    let mut parts = e.subject.rsplitn(4, '/');
    let name = parts.next()?;
    let namespace = parts.next()?;
    let kind = parts.next()?;
    let api_version = parts.next()?;
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    if name.is_empty() || kind.is_empty() || version.is_empty() || version.contains('/') {
        return None;
    }
    let namespace = if namespace == "_" { "" } else { namespace };
    Some(WatchEvent {
        watched: Watched { namespace: namespace.into(), name: name.into() },
        watched_gvk: Gvk { group: group.into(), version: version.into(), kind: kind.into() },
    })
}

/// Where a component's events go: `{target}/v2/{component}/event`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    /// The listener's base URL (e.g. the gateway).
    pub target: String,
    /// The component (KLM: `lifecycle-manager`).
    pub component: String,
}

impl Route {
    /// The endpoint URL.
    pub fn url(&self) -> String {
        format!("{}/v{CONTRACT_VERSION}/{}/event", self.target.trim_end_matches('/'), self.component)
    }
}

/// Which route an event takes: by the watch (WatchConfig name) that produced it, else the
/// default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    /// Per watch name (from `--from-watchers`).
    pub by_watch: BTreeMap<String, Route>,
    /// For every other watch (`--target` with `--component`).
    pub default: Option<Route>,
}

impl Routes {
    /// One route for everything.
    pub fn single(route: Route) -> Self {
        Self { by_watch: BTreeMap::new(), default: Some(route) }
    }

    /// The route of an event from `watch`.
    pub fn route(&self, watch: Option<&str>) -> Option<&Route> {
        watch.and_then(|w| self.by_watch.get(w)).or(self.default.as_ref())
    }

    /// Where a resync fallback goes: the default route, else every route there is.
    fn fallback_routes(&self) -> Vec<Route> {
        match &self.default {
            Some(r) => vec![r.clone()],
            None => self.by_watch.values().cloned().collect::<BTreeSet<_>>().into_iter().collect(),
        }
    }
}

/// What the KLM relay does besides routing.
#[derive(Debug, Clone)]
pub struct KlmConfig {
    /// Only events of these watches (WatchConfig names); all when empty.
    pub watches: Vec<String>,
    /// The object a resync falls back to for a cluster the relay knows no object of.
    pub fallback: WatchEvent,
    /// Most objects remembered (all clusters) for resyncs.
    pub max_known: usize,
    /// Where events refused for good (400, 413, 422) are kept before they are
    /// acknowledged; without it they are skipped and counted.
    pub dead_letter: Option<Arc<crate::dead_letter::DeadLetter>>,
}

impl Default for KlmConfig {
    fn default() -> Self {
        Self { watches: Vec::new(), fallback: WatchEvent::kyma_default(), max_known: 100_000, dead_letter: None }
    }
}

#[derive(Debug, Default)]
struct KnownCluster {
    objects: BTreeMap<WatchEvent, Route>,
    /// Some object was not remembered (the bound): a resync needs the fallback too.
    overflowed: bool,
}

/// The objects relayed per cluster, for resyncs. Bounded in total.
#[derive(Debug, Default)]
pub struct Known {
    clusters: HashMap<String, KnownCluster>,
    total: usize,
    max: usize,
}

impl Known {
    /// Remembers at most `max` objects.
    pub fn new(max: usize) -> Self {
        Self { clusters: HashMap::new(), total: 0, max }
    }

    /// An object was relayed as changed.
    pub fn applied(&mut self, cluster: &str, ev: &WatchEvent, route: &Route) {
        let c = self.clusters.entry(cluster.to_string()).or_default();
        if let Some(r) = c.objects.get_mut(ev) {
            *r = route.clone();
        } else if self.total < self.max {
            c.objects.insert(ev.clone(), route.clone());
            self.total += 1;
        } else {
            c.overflowed = true;
        }
    }

    /// An object was relayed as deleted.
    pub fn deleted(&mut self, cluster: &str, ev: &WatchEvent) {
        if let Some(c) = self.clusters.get_mut(cluster)
            && c.objects.remove(ev).is_some()
        {
            self.total -= 1;
        }
    }

    /// The objects known for `cluster`, and whether some were not remembered.
    pub fn of(&self, cluster: &str) -> (Vec<(WatchEvent, Route)>, bool) {
        match self.clusters.get(cluster) {
            Some(c) => (c.objects.iter().map(|(e, r)| (e.clone(), r.clone())).collect(), c.overflowed),
            None => (Vec::new(), false),
        }
    }

    /// Every cluster the relay saw an event of.
    pub fn clusters(&self) -> Vec<String> {
        let mut v: Vec<_> = self.clusters.keys().cloned().collect();
        v.sort();
        v
    }

    /// Objects remembered in all.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }
}

/// One request to a listener.
#[derive(Debug, Clone)]
struct Request {
    cluster: String,
    route: Route,
    event: WatchEvent,
    body: Vec<u8>,
}

/// Identifies a delivery across retries: (last cursor, number of events).
type DeliveryKey = (Option<u64>, usize);

/// The KLM relay as a [`Sink`].
pub struct KlmSink {
    cfg: KlmConfig,
    client: reqwest::Client,
    identity: Arc<IdentityMinter>,
    routes: tokio::sync::watch::Receiver<Arc<Routes>>,
    metrics: Arc<Metrics>,
    known: Known,
    /// The requests of the delivery being offered that are still to be accepted, keyed by
    /// the delivery's (last cursor, length): a retry continues where it stopped.
    pending: Option<(DeliveryKey, VecDeque<Request>)>,
    said: SaidOnce,
}

impl KlmSink {
    /// A sink sending with `client`, identities from `identity`, routes from `routes`.
    pub fn new(
        cfg: KlmConfig,
        client: reqwest::Client,
        identity: Arc<IdentityMinter>,
        routes: tokio::sync::watch::Receiver<Arc<Routes>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let known = Known::new(cfg.max_known);
        Self { cfg, client, identity, routes, metrics, known, pending: None, said: SaidOnce::new(256) }
    }

    /// The objects remembered for resyncs.
    pub fn known(&self) -> &Known {
        &self.known
    }

    fn request(&mut self, cluster: &str, route: &Route, event: WatchEvent) -> Option<Request> {
        match event.body() {
            Ok(body) => Some(Request { cluster: cluster.into(), route: route.clone(), event, body }),
            Err(size) => {
                let url = route.url();
                self.metrics.refused(Refused::TooLarge, &url);
                tracing::warn!(%cluster, target = %url, object = ?event.watched, size, limit = BODY_LIMIT,
                    "not sending an event whose body exceeds the listener's limit");
                None
            }
        }
    }

    /// The requests a delivery makes, updating what is known.
    fn plan(&mut self, delivery: &Delivery) -> VecDeque<Request> {
        let routes = self.routes.borrow().clone();
        let mut out = VecDeque::new();
        match delivery {
            Delivery::Events(events) => {
                let mut filtered = 0;
                for e in events {
                    let wanted = self.cfg.watches.is_empty()
                        || e.watch.as_ref().is_some_and(|w| self.cfg.watches.iter().any(|x| x == w));
                    let Some(ev) = watch_event(e).filter(|_| wanted) else {
                        filtered += 1;
                        continue;
                    };
                    // No route: a watch of another subscriber (with `--from-watchers`, only
                    // the Watchers' watches are routed): not for this relay.
                    let Some(route) = routes.route(e.watch.as_deref()).cloned() else {
                        filtered += 1;
                        continue;
                    };
                    if e.is_delete() {
                        self.known.deleted(&e.cluster, &ev);
                    } else {
                        self.known.applied(&e.cluster, &ev, &route);
                    }
                    if let Some(r) = self.request(&e.cluster, &route, ev) {
                        out.push_back(r);
                    }
                }
                if filtered > 0 {
                    self.metrics.filtered(filtered);
                }
            }
            Delivery::ResyncRequired(r) => {
                let clusters = if r.cluster == "*" { self.known.clusters() } else { vec![r.cluster.clone()] };
                if clusters.is_empty() {
                    self.metrics.resync("unresolved");
                    tracing::warn!(reason = %r.reason,
                        "resync-required for every cluster, but the relay knows no cluster yet: nothing to send");
                }
                for cluster in clusters {
                    let (objects, overflowed) = self.known.of(&cluster);
                    tracing::info!(%cluster, objects = objects.len(), overflowed, reason = %r.reason, "resync-required");
                    let none_known = objects.is_empty();
                    if !none_known {
                        self.metrics.resync("objects");
                    }
                    for (ev, route) in objects {
                        if let Some(req) = self.request(&cluster, &route, ev) {
                            out.push_back(req);
                        }
                    }
                    if none_known || overflowed {
                        self.metrics.resync("fallback");
                        for route in routes.fallback_routes() {
                            if let Some(req) = self.request(&cluster, &route, self.cfg.fallback.clone()) {
                                out.push_back(req);
                            }
                        }
                    }
                }
            }
        }
        out
    }

    async fn send_one(&mut self, req: &Request) -> Result<(), SinkError> {
        let url = req.route.url();
        let xfcc = match self.identity.xfcc(&req.cluster) {
            Ok(x) => x,
            Err(e) => {
                self.metrics.refused(Refused::NoIdentity, &url);
                tracing::error!(cluster = %req.cluster, target = %url, error = %e, "cannot mint the runtime's identity; not sending");
                return Ok(());
            }
        };
        let rb = self
            .client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(XFCC_HEADER, &*xfcc)
            .body(req.body.clone());
        match send(rb).await {
            Outcome::Accepted => {
                self.metrics.add(Counter::Delivered, &url, 1);
                tracing::debug!(target = %url, object = ?req.event.watched, "relayed");
                Ok(())
            }
            Outcome::Retry(why) => {
                self.metrics.add(Counter::Retries, &url, 1);
                Err(SinkError::Retry {
                    sink: "klm".into(),
                    source: format!(
                        "{url}: {why} (cluster {}, {} {}/{})",
                        req.cluster, req.event.watched_gvk.kind, req.event.watched.namespace, req.event.watched.name
                    )
                    .into(),
                })
            }
            Outcome::Rejected { status, body } if self.cfg.dead_letter.is_some() => {
                let dl = self.cfg.dead_letter.clone().expect("guarded by the match arm");
                if let Err(e) = dl.append(&url, status, &body, &req.body) {
                    // Not kept: not acknowledged either; the event waits at the hub.
                    self.metrics.add(Counter::Retries, &url, 1);
                    return Err(SinkError::Retry {
                        sink: "klm".into(),
                        source: format!("{url}: {status} {body}, and {e} (cluster {})", req.cluster).into(),
                    });
                }
                self.metrics.add(Counter::DeadLettered, &url, 1);
                if self.said.first(&format!("{url} {status} {body}")) {
                    tracing::warn!(target = %url, status, answer = %body, object = ?req.event.watched, file = %dl.path().display(),
                        "the listener refused an event for good; kept in the dead-letter file (logged once per cause)");
                }
                Ok(())
            }
            Outcome::Rejected { status, body } => {
                self.metrics.add(Counter::Skipped4xx, &url, 1);
                if self.said.first(&format!("{url} {status} {body}")) {
                    tracing::warn!(target = %url, status, answer = %body, object = ?req.event.watched,
                        "the listener refused an event for good; skipping it (logged once per cause)");
                }
                Ok(())
            }
        }
    }
}

impl Sink for KlmSink {
    fn name(&self) -> &str {
        "klm"
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<Accepted, SinkError> {
        let key = (
            delivery.last_cursor(),
            match delivery {
                Delivery::Events(e) => e.len(),
                Delivery::ResyncRequired(_) => 0,
            },
        );
        if self.pending.as_ref().is_none_or(|(k, _)| *k != key) {
            let planned = self.plan(delivery);
            self.pending = Some((key, planned));
        }
        while let Some(req) = self.pending.as_mut().and_then(|(_, q)| q.front().cloned()) {
            let span = tracing::info_span!("klm", cluster = %req.cluster);
            self.send_one(&req).instrument(span).await?;
            if let Some((_, q)) = self.pending.as_mut() {
                q.pop_front();
            }
        }
        self.pending = None;
        Ok(Accepted::All)
    }
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::event::ObjectKey;
    use serde_json::json;

    use super::*;

    fn ev(api: &str, kind: &str, ns: Option<&str>, name: &str) -> Event {
        Event::applied("rt-1", 1, 1, &ObjectKey::new(api, kind, ns, name), json!({}))
    }

    #[test]
    fn the_body_is_exactly_the_contract() {
        let e = watch_event(&ev("operator.kyma-project.io/v1beta2", "Kyma", Some("kyma-system"), "default")).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&e.body().unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"watched": {"namespace": "kyma-system", "name": "default"},
                   "watchedGvk": {"group": "operator.kyma-project.io", "version": "v1beta2", "kind": "Kyma"}})
        );
        assert_eq!(e, WatchEvent::kyma_default());
        let core = watch_event(&ev("v1", "ConfigMap", Some("apps"), "web")).unwrap();
        assert_eq!(core.watched_gvk, Gvk { group: String::new(), version: "v1".into(), kind: "ConfigMap".into() });
        let cluster_scoped = watch_event(&ev("v1", "Namespace", None, "prod")).unwrap();
        assert_eq!(cluster_scoped.watched, Watched { namespace: String::new(), name: "prod".into() });
    }

    #[test]
    fn events_about_no_object_have_no_body() {
        let mut inv = ev("v1", "ConfigMap", Some("a"), "b");
        inv.subject = fleetwatch_protocol::event::INVENTORY_SUBJECT.into();
        assert_eq!(watch_event(&inv), None);
        inv.subject = "a/b/c/d/e/f".into();
        assert_eq!(watch_event(&inv), None, "an apiVersion with two slashes is no apiVersion");
    }

    #[test]
    fn bodies_over_16_kib_are_refused() {
        let mut e = WatchEvent::kyma_default();
        e.watched.name = "x".repeat(BODY_LIMIT);
        assert!(matches!(e.body(), Err(n) if n > BODY_LIMIT));
        e.watched.name = "x".repeat(BODY_LIMIT - 200);
        assert!(e.body().is_ok());
    }

    #[test]
    fn routes_by_watch_else_default_and_urls() {
        let lm = Route { target: "https://gw.example/".into(), component: "lifecycle-manager".into() };
        assert_eq!(lm.url(), "https://gw.example/v2/lifecycle-manager/event");
        let other = Route { target: "http://o".into(), component: "other".into() };
        let mut routes = Routes::single(lm.clone());
        routes.by_watch.insert("w-other".into(), other.clone());
        assert_eq!(routes.route(Some("w-other")), Some(&other));
        assert_eq!(routes.route(Some("x")), Some(&lm));
        assert_eq!(routes.route(None), Some(&lm));
        assert_eq!(routes.fallback_routes(), vec![lm]);
        routes.default = None;
        assert_eq!(routes.route(Some("x")), None);
        assert_eq!(routes.fallback_routes(), vec![other]);
    }

    #[test]
    fn known_objects_are_bounded_and_deletes_forget() {
        let r = Route { target: "t".into(), component: "c".into() };
        let a = watch_event(&ev("v1", "ConfigMap", Some("n"), "a")).unwrap();
        let b = watch_event(&ev("v1", "ConfigMap", Some("n"), "b")).unwrap();
        let mut k = Known::new(1);
        k.applied("c1", &a, &r);
        k.applied("c1", &a, &r);
        assert_eq!(k.len(), 1);
        k.applied("c1", &b, &r);
        let (objs, overflowed) = k.of("c1");
        assert_eq!((objs.len(), overflowed), (1, true));
        k.deleted("c1", &a);
        assert!(k.is_empty());
        assert_eq!(k.clusters(), vec!["c1".to_string()]);
        assert_eq!(k.of("nope"), (Vec::new(), false));
    }
}
