//! Watching a kind one object at a time: an object that does not decode into its Rust type
//! (an unknown enum value, a wrong type that the API server accepted) is named in one log
//! line per distinct error and left out, so one bad object never stops the others.
//!
//! A typed `watcher` decodes a whole list at once: one undecodable Runtime made every
//! list fail and the operator (and the sandbox's table) saw no Runtime at all.
//!
//! [`watch_checked`] also runs a check on each decoded object (the operator's own rules, e.g.
//! a maintenance window that parses): an object that fails it is passed on (the code that uses
//! it fails closed on its own) but reported like an undecodable one, and an object reported
//! before that is usable again is reported once more, so its status can say so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{Stream, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// An object that could not be decoded or failed the check, and why; or, with no error, one
/// that was reported (or whose status says it is not usable) and is usable again.
#[derive(Debug, Clone)]
pub struct Invalid {
    /// `namespace/name` (or `name` for cluster-scoped kinds).
    pub key: String,
    /// The object's namespace.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
    /// The decoding or check error; `None` when the object is usable again.
    pub error: Option<String>,
}

/// The condition type that [`watch_checked`]'s reports end up in: an object whose status
/// holds it as `False` is reported as usable again once it decodes and passes the check,
/// also after a restart of the operator.
pub const USABLE: &str = "Usable";

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
    watch_checked(client, config, invalid, |_: &K| Ok(()))
}

/// [`watch`], and each decoded object is also given to `check`: an error is reported (once per
/// distinct error) while the object is still passed on.
pub fn watch_checked<K, C>(
    client: kube::Client,
    config: watcher::Config,
    invalid: Option<tokio::sync::mpsc::Sender<Invalid>>,
    check: C,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + std::fmt::Debug + 'static,
    C: Fn(&K) -> Result<(), String> + Send + 'static,
{
    let ar = ApiResource::erase::<K>(&());
    let kind = ar.kind.clone();
    let api: Api<DynamicObject> = Api::all_with(client, &ar);
    // Per object: the error reported last. Keyed by error, not resourceVersion, so a status
    // written about the bad object (a new resourceVersion) does not report it again.
    let reported: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    watcher::watcher(api, config).filter_map(move |ev| {
        // `deleted`: decoded as far as it can be, never reported (there is no status to write).
        let decode = |o: DynamicObject, deleted: bool| -> Option<K> {
            let key = match o.namespace() {
                Some(ns) => format!("{ns}/{}", o.name_any()),
                None => o.name_any(),
            };
            let (namespace, name) = (o.namespace(), o.name_any());
            let marked_unusable = marked_unusable(&o);
            let decoded = serde_json::to_value(&o).and_then(serde_json::from_value::<K>);
            if deleted {
                if let Ok(mut r) = reported.lock() {
                    r.remove(&key);
                }
                return decoded.ok();
            }
            match decoded {
                Ok(k) => {
                    if let Err(error) = check(&k) {
                        let _: Option<K> = report(&reported, &invalid, &kind, key, namespace, name, error);
                        return Some(k);
                    }
                    let was_reported = reported.lock().map(|mut r| r.remove(&key).is_some()).unwrap_or(false);
                    if was_reported || marked_unusable {
                        tracing::info!(kind, object = %key, "object is usable again");
                        if let Some(tx) = &invalid {
                            let _ = tx.try_send(Invalid { key, namespace, name, error: None });
                        }
                    }
                    Some(k)
                }
                Err(e) => report(&reported, &invalid, &kind, key, namespace, name, e.to_string()),
            }
        };
        let out = match ev {
            Err(e) => Some(Err(e)),
            Ok(Event::Apply(o)) => decode(o, false).map(|k| Ok(Event::Apply(k))),
            Ok(Event::InitApply(o)) => decode(o, false).map(|k| Ok(Event::InitApply(k))),
            Ok(Event::Delete(o)) => decode(o, true).map(|k| Ok(Event::Delete(k))),
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
            let _ = tx.try_send(Invalid { key, namespace, name, error: Some(error) });
        }
    }
    None
}

/// Whether the object's status holds a [`USABLE`] condition that is `False`.
fn marked_unusable(o: &DynamicObject) -> bool {
    o.data
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        // Unmet requirements are judged and cleared by `usable::keep_requirements`, not here.
        .is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == USABLE && c["status"] == "False" && c["reason"] != crate::usable::UNMET_REQUIREMENTS
            })
        })
}
