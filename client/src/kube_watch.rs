//! A Kubernetes watch that starts over with a fresh list after an error, so that whatever
//! a failure made a component say ("the watch is failing") is taken back by the watch
//! itself once it works again.
//!
//! kube-runtime's [`watcher`] resumes a broken watch from its last resourceVersion and
//! emits nothing when the resumed watch starts: after a transient failure (an API server
//! restart, a 500, a dropped connection) a status set from the error would stay until the
//! next change of a watched object, which in a quiet cluster may be never — a false alarm
//! in a WatchConfig's status, `/readyz` and the `FleetwatchWatchFailing` alert. This
//! stream drops the watcher after an error and, after a backoff, starts a new one: its
//! `Init` … `InitDone` says the watch is listed and running again. That is what client-go's
//! reflector does too (a failed watch ends `ListAndWatch`, which lists again, served from
//! the API server's watch cache).
//!
//! The relist costs a list per failure, bounded by the backoff (from 500 ms to 30 s with
//! jitter, reset by each completed list); consumers diff the list against what they know
//! (the agent's filter emits only what changed and turns what vanished into deletes).
//!
//! ```no_run
//! # async fn demo(client: kube::Client) {
//! use futures_util::StreamExt;
//! use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
//! use kube::runtime::watcher::{self, Event};
//!
//! let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap"));
//! let api: kube::Api<DynamicObject> = kube::Api::all_with(client, &ar);
//! let stream = fleetwatch_client::kube_watch::relisting_watcher(api, watcher::Config::default());
//! futures_util::pin_mut!(stream);
//! while let Some(ev) = stream.next().await {
//!     match ev {
//!         Ok(Event::InitDone) => { /* listed: the watch works (again) */ }
//!         Err(e) => { /* say so; the stream lists again after a backoff */ }
//!         _ => {}
//!     }
//! }
//! # }
//! ```

use std::fmt::Debug;
use std::time::Duration;

use futures_util::stream::{BoxStream, Stream, StreamExt};
use kube::Resource;
use kube::runtime::watcher::{self, Event, watcher};
use serde::de::DeserializeOwned;

use crate::backoff::Reconnect;

/// The delays between a failure and the next list.
const RELIST: Reconnect = Reconnect { min: Duration::from_millis(500), max: Duration::from_secs(30) };

/// A watch of `api` that, after every error, waits (exponential backoff with jitter) and
/// starts over with a fresh list. It never ends by itself.
pub fn relisting_watcher<K>(
    api: kube::Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    relisting(move || watcher(api.clone(), config.clone()).boxed(), RELIST)
}

/// The restart logic apart from kube, so it can be tested with any stream.
fn relisting<K, F>(start: F, backoff: Reconnect) -> impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static
where
    K: Send + 'static,
    F: Fn() -> BoxStream<'static, watcher::Result<Event<K>>> + Send + 'static,
{
    struct State<K, F> {
        start: F,
        current: Option<BoxStream<'static, watcher::Result<Event<K>>>>,
        delays: Box<dyn Iterator<Item = Duration> + Send>,
        backoff: Reconnect,
        wait: Option<Duration>,
    }
    let state = State { start, current: None, delays: Box::new(backoff.delays()), backoff, wait: None };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(d) = s.wait.take() {
                tokio::time::sleep(d).await;
            }
            let stream = s.current.get_or_insert_with(|| (s.start)());
            match stream.next().await {
                Some(Ok(ev)) => {
                    if matches!(ev, Event::InitDone) {
                        // Listed: the next failure starts from the shortest delay again.
                        s.delays = Box::new(s.backoff.delays());
                    }
                    return Some((Ok(ev), s));
                }
                Some(Err(e)) => {
                    s.current = None;
                    s.wait = s.delays.next();
                    return Some((Err(e), s));
                }
                // A watcher does not end; if one did, start over (after a delay, so a
                // stream that ends at once cannot spin).
                None => {
                    s.current = None;
                    s.wait = s.delays.next();
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn failure() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    /// Each start of the inner watch lists once; the first run fails after its list.
    fn scripted(starts: Arc<AtomicUsize>) -> impl Fn() -> BoxStream<'static, watcher::Result<Event<u32>>> {
        move || {
            let n = starts.fetch_add(1, Ordering::SeqCst);
            let mut evs = vec![Ok(Event::Init), Ok(Event::InitApply(n as u32)), Ok(Event::InitDone)];
            if n == 0 {
                evs.push(Ok(Event::Apply(7)));
                evs.push(Err(failure()));
                // A resumed kube watcher would go on here without saying so.
                evs.push(Ok(Event::Apply(8)));
            }
            let quiet = futures_util::stream::pending();
            futures_util::stream::iter(evs).chain(quiet).boxed()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_an_error_the_watch_lists_again_and_says_it_is_done() {
        let starts = Arc::new(AtomicUsize::new(0));
        let backoff = Reconnect { min: Duration::from_millis(10), max: Duration::from_millis(40) };
        let stream = relisting(scripted(starts.clone()), backoff);
        futures_util::pin_mut!(stream);
        let mut seen = Vec::new();
        for _ in 0..8 {
            let ev = stream.next().await.expect("never ends");
            seen.push(match ev {
                Ok(Event::Init) => "init".to_string(),
                Ok(Event::InitApply(n)) => format!("listed {n}"),
                Ok(Event::InitDone) => "done".to_string(),
                Ok(Event::Apply(n)) => format!("apply {n}"),
                Ok(Event::Delete(n)) => format!("delete {n}"),
                Err(_) => "error".to_string(),
            });
        }
        assert_eq!(
            seen,
            ["init", "listed 0", "done", "apply 7", "error", "init", "listed 1", "done"].map(String::from)[..],
            "the failed watch is not resumed silently (no `apply 8`), it is listed again"
        );
        assert_eq!(starts.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_a_completed_list_resets_the_delay() {
        let starts = Arc::new(AtomicUsize::new(0));
        let s2 = starts.clone();
        // Three starts fail at once, then one lists.
        let start = move || {
            let n = s2.fetch_add(1, Ordering::SeqCst);
            let evs: Vec<watcher::Result<Event<u32>>> =
                if n < 3 { vec![Err(failure())] } else { vec![Ok(Event::Init), Ok(Event::InitDone)] };
            futures_util::stream::iter(evs).chain(futures_util::stream::pending()).boxed()
        };
        let backoff = Reconnect { min: Duration::from_millis(100), max: Duration::from_secs(10) };
        let stream = relisting(start, backoff);
        futures_util::pin_mut!(stream);
        let t0 = tokio::time::Instant::now();
        for _ in 0..3 {
            assert!(stream.next().await.unwrap().is_err());
        }
        assert!(matches!(stream.next().await, Some(Ok(Event::Init))));
        assert!(matches!(stream.next().await, Some(Ok(Event::InitDone))));
        // 100 + 200 + 400 ms at least (jitter only adds): the failures were not retried in a loop.
        assert!(t0.elapsed() >= Duration::from_millis(700), "{:?}", t0.elapsed());
        assert_eq!(starts.load(Ordering::SeqCst), 4);
    }
}
