//! Watching a kind one object at a time: an object that does not decode into its Rust type
//! (an unknown enum value, a wrong type that the API server accepted) is named in one log
//! line per distinct error and left out, so one bad object never stops the others.
//!
//! A typed `watcher` decodes a whole list at once: one undecodable Runtime made every
//! list fail and the operator (and the sandbox's table) saw no Runtime at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// An object that could not be decoded, and why.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// `namespace/name` (or `name` for cluster-scoped kinds).
    pub key: String,
    /// The object's namespace.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// The decoding error.
    pub error: String,
}

/// A watch of `K` over all namespaces that decodes each object on its own. Undecodable
/// objects are logged once per distinct error and sent to `invalid` (when given, without
/// waiting: a full channel drops the report, never the watch).
///
/// A deletion of an object that no longer decodes is passed on only as far as it can be:
/// it is skipped, and the reflector's next relist drops the stale entry.
pub fn watch<K>(
    client: kube::Client,
    config: watcher::Config,
    invalid: Option<tokio::sync::mpsc::Sender<Invalid>>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static,
{
    let ar = ApiResource::erase::<K>(&());
    let kind = ar.kind.clone();
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    // Per object: the error reported last. Keyed by error, not resourceVersion, so a status
    // written about the bad object (a new resourceVersion) does not report it again.
    let reported: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    watcher::watcher(api, config).filter_map(move |ev| {
        let decode = |o: DynamicObject| -> Option<K> {
            let key = match o.namespace() {
                Some(ns) => format!("{ns}/{}", o.name_any()),
                None => o.name_any(),
            };
            let (namespace, name) = (o.namespace(), o.name_any());
            let decoded = serde_json::to_value(&o).and_then(serde_json::from_value::<K>);
            match decoded {
                Ok(k) => {
                    if let Ok(mut r) = reported.lock() {
                        r.remove(&key);
                    }
                    Some(k)
                }
                Err(e) => report(&reported, &invalid, &kind, key, namespace, name, e.to_string()),
            }
        };
        let out = match ev {
            Err(e) => Some(Err(e)),
            Ok(Event::Apply(o)) => decode(o).map(|k| Ok(Event::Apply(k))),
            Ok(Event::InitApply(o)) => decode(o).map(|k| Ok(Event::InitApply(k))),
            Ok(Event::Delete(o)) => decode(o).map(|k| Ok(Event::Delete(k))),
            Ok(Event::Init) => Some(Ok(Event::Init)),
            Ok(Event::InitDone) => Some(Ok(Event::InitDone)),
        };
        futures_util::future::ready(out)
    })
}

fn report<K>(
    reported: &Mutex<HashMap<String, String>>,
    invalid: &Option<tokio::sync::mpsc::Sender<Invalid>>,
    kind: &str,
    key: String,
    namespace: Option<String>,
    name: String,
    error: String,
) -> Option<K> {
    let first = reported.lock().map(|mut r| {
        // Bounded: one entry per bad object; forget them all should it ever grow large.
        if r.len() > 10_000 {
            r.clear();
        }
        r.insert(key.clone(), error.clone()).as_deref() != Some(error.as_str())
    });
    if first.unwrap_or(true) {
        tracing::warn!(kind, object = %key, %error, "cannot decode object; skipping it until it is fixed");
        if let Some(tx) = invalid {
            let _ = tx.try_send(Invalid { key, namespace, name, error });
        }
    }
    None
}
