//! WATCH: registering a watcher (initial events, replay from the history, or 410 when the
//! requested resourceVersion is older than what is retained) and the streaming response
//! body with bookmarks, `timeoutSeconds` and shutdown.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::Stream;
use hyper::body::Frame;
#[cfg(test)]
use serde_json::Value;
use serde_json::json;
use tokio::sync::mpsc;

use crate::cluster::Core;
use crate::error::ApiError;
use crate::ops;
use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{State, WatcherReg, event_line, render_line};

/// The query parameters of a watch request.
#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub resource_version: Option<String>,
    pub send_initial_events: Option<bool>,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

/// What a watch starts with.
pub struct Registered {
    /// Objects (their JSON) to send first as ADDED events; the lines are built by the
    /// watch's own task, outside the state lock.
    pub initial_added: Vec<Bytes>,
    /// Lines to send next (replayed history, the initial-events-end bookmark, or a 410
    /// ERROR event).
    pub initial: Vec<Bytes>,
    /// Live events; `None` when the watch ends after `initial` (expired).
    pub rx: Option<mpsc::Receiver<Bytes>>,
}

/// A BOOKMARK line at `rv`.
pub fn bookmark_line(def: &ResourceDef, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    render_line("BOOKMARK", &json!({"kind": def.kind, "apiVersion": def.api_version(), "metadata": meta}))
}

/// An ERROR line carrying a Status.
pub fn error_line(e: &ApiError) -> Bytes {
    render_line("ERROR", &e.to_status())
}

/// Registers a watch on the locked state, so that nothing written after the initial
/// snapshot or replay can be missed.
pub fn register(st: &mut State, def: &ResourceDef, p: &WatchParams, buffer: usize) -> Result<Registered, ApiError> {
    let streaming = p.send_initial_events == Some(true);
    if streaming && !p.bookmarks {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[(
                "allowWatchBookmarks",
                "Required value: sendInitialEvents requires setting allowWatchBookmarks to true".into(),
            )],
        ));
    }
    let rv_param = p.resource_version.as_deref().unwrap_or("");
    let reg = |tx| WatcherReg {
        id: st.next_watcher,
        namespace: p.namespace.clone().filter(|_| def.namespaced),
        labels: p.labels.clone(),
        fields: p.fields.clone(),
        api_version: def.api_version(),
        tx,
    };
    let mut initial = Vec::new();
    let mut initial_added = Vec::new();
    let snapshot = streaming || ((rv_param.is_empty() || rv_param == "0") && p.send_initial_events != Some(false));
    if snapshot {
        let page = ops::list(st, def, p.namespace.as_deref(), &p.labels, &p.fields, None, None)?;
        initial_added = page.items.into_iter().map(|o| o.json).collect();
        if streaming {
            initial.push(bookmark_line(def, st.rv, true));
        }
    } else if !rv_param.is_empty() {
        let from: u64 =
            rv_param.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv_param}")))?;
        if from < st.floor {
            let e = ApiError::expired(format!("too old resource version: {from} ({})", st.floor));
            return Ok(Registered { initial_added, initial: vec![error_line(&e)], rx: None });
        }
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let w = reg(tx.clone());
        for ev in st.history.iter().filter(|e| e.rv > from && e.key == def.key()) {
            if let Some(line) = w.line_for(ev) {
                initial.push(line);
            }
        }
        st.next_watcher += 1;
        st.watchers.entry(def.key()).or_default().push(w);
        return Ok(Registered { initial_added, initial, rx: Some(rx) });
    }
    let (tx, rx) = mpsc::channel(buffer.max(1));
    let w = reg(tx);
    st.next_watcher += 1;
    st.watchers.entry(def.key()).or_default().push(w);
    Ok(Registered { initial_added, initial, rx: Some(rx) })
}

struct StreamState {
    core: Arc<Core>,
    def: ResourceDef,
    initial: Option<(Vec<Bytes>, Vec<Bytes>)>,
    rx: Option<mpsc::Receiver<Bytes>>,
    bookmarks: Option<tokio::time::Interval>,
    deadline: std::pin::Pin<Box<tokio::time::Sleep>>,
}

/// The response body of a watch: chunks of newline-separated JSON events.
pub fn body_stream(
    core: Arc<Core>,
    def: ResourceDef,
    reg: Registered,
    bookmarks: bool,
    timeout: Duration,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + 'static {
    let interval = core.options.bookmark_interval;
    let st = StreamState {
        core,
        def,
        initial: Some((reg.initial_added, reg.initial)),
        rx: reg.rx,
        bookmarks: bookmarks.then(|| {
            let mut i = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        }),
        deadline: Box::pin(tokio::time::sleep(timeout)),
    };
    futures_util::stream::unfold(st, |mut s| async move {
        if let Some((added, initial)) = s.initial.take()
            && !(added.is_empty() && initial.is_empty())
        {
            let len = added.iter().map(|o| o.len() + 32).sum::<usize>() + initial.iter().map(Bytes::len).sum::<usize>();
            let mut buf = BytesMut::with_capacity(len);
            for o in added {
                buf.extend_from_slice(&event_line("ADDED", &o));
            }
            for l in initial {
                buf.extend_from_slice(&l);
            }
            return Some((Ok(Frame::data(buf.freeze())), s));
        }
        let rx = s.rx.as_mut()?;
        let shutdown = s.core.shutdown.clone();
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => None,
            _ = &mut s.deadline => None,
            m = rx.recv() => {
                let first = m?;
                // One event goes out as the shared bytes themselves; what is already queued
                // behind it is coalesced into one chunk (one write, one TLS record).
                let Ok(second) = rx.try_recv() else {
                    return Some((Ok(Frame::data(first)), s));
                };
                let mut buf = BytesMut::with_capacity(first.len() * 4);
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&second);
                while buf.len() < 64 * 1024 {
                    match rx.try_recv() {
                        Ok(more) => buf.extend_from_slice(&more),
                        Err(_) => break,
                    }
                }
                Some((Ok(Frame::data(buf.freeze())), s))
            }
            _ = async { match s.bookmarks.as_mut() { Some(i) => { i.tick().await; } None => std::future::pending::<()>().await } } => {
                // Everything queued was written at or before the current resourceVersion,
                // so send it first, then the bookmark.
                let mut buf = BytesMut::new();
                let rv = {
                    let st = s.core.lock();
                    while let Ok(more) = rx.try_recv() {
                        buf.extend_from_slice(&more);
                    }
                    st.rv
                };
                buf.extend_from_slice(&bookmark_line(&s.def, rv, false));
                Some((Ok(Frame::data(buf.freeze())), s))
            }
        }
    })
}

/// Default watch duration when the client sets no `timeoutSeconds` (kube-apiserver picks
/// 30–60 minutes).
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Parses a watch line.
#[cfg(test)]
pub fn parse_line(line: &[u8]) -> Option<(String, Value)> {
    let v: Value = serde_json::from_slice(line).ok()?;
    Some((v["type"].as_str()?.to_string(), v["object"].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{WriteOpts, create};

    fn setup() -> (State, ResourceDef) {
        let mut st = State::new(3);
        let ns = st.registry.get("", "v1", "namespaces").cloned().unwrap();
        create(&mut st, &ns, None, json!({"metadata": {"name": "d"}}), &WriteOpts::default()).unwrap();
        let def = st.registry.get("", "v1", "configmaps").cloned().unwrap();
        (st, def)
    }

    fn cm(st: &mut State, def: &ResourceDef, n: &str) {
        create(st, def, Some("d"), json!({"metadata": {"name": n}}), &WriteOpts::default()).unwrap();
    }

    #[test]
    fn streaming_list_ends_with_initial_events_bookmark() {
        let (mut st, def) = setup();
        cm(&mut st, &def, "a");
        let p = WatchParams {
            send_initial_events: Some(true),
            bookmarks: true,
            resource_version: Some(String::new()),
            ..Default::default()
        };
        let r = register(&mut st, &def, &p, 10).unwrap();
        assert_eq!(r.initial_added.len(), 1);
        assert_eq!(serde_json::from_slice::<Value>(&r.initial_added[0]).unwrap()["metadata"]["name"], "a");
        assert_eq!(r.initial.len(), 1);
        let (ty, obj) = parse_line(&r.initial[0]).unwrap();
        assert_eq!(ty, "BOOKMARK");
        assert_eq!(obj["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        assert_eq!(obj["metadata"]["resourceVersion"], st.rv.to_string());
    }

    #[test]
    fn watch_from_rv_replays_and_expires() {
        let (mut st, def) = setup();
        cm(&mut st, &def, "a");
        let rv = st.rv;
        cm(&mut st, &def, "b");
        let p = WatchParams { resource_version: Some(rv.to_string()), ..Default::default() };
        let r = register(&mut st, &def, &p, 10).unwrap();
        assert_eq!(r.initial.len(), 1);
        assert_eq!(parse_line(&r.initial[0]).unwrap().1["metadata"]["name"], "b");
        // History holds 3 events; after more writes rv is too old.
        for n in ["c", "d", "e", "f"] {
            cm(&mut st, &def, n);
        }
        let r = register(&mut st, &def, &p, 10).unwrap();
        assert!(r.rx.is_none());
        let (ty, obj) = parse_line(&r.initial[0]).unwrap();
        assert_eq!(ty, "ERROR");
        assert_eq!(obj["code"], 410);
        assert_eq!(obj["reason"], "Expired");
    }

    #[test]
    fn streaming_without_bookmarks_is_invalid() {
        let (mut st, def) = setup();
        let p = WatchParams { send_initial_events: Some(true), ..Default::default() };
        assert_eq!(register(&mut st, &def, &p, 10).err().map(|e| e.code), Some(422));
    }
}
