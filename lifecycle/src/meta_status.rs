//! Keeps each ModuleReleaseMeta's `status.channels` equal to its channels' summary
//! (`fast=2.0.0 regular=1.0.0`), the `Channels` column of `kubectl get modulereleasemetas`:
//! a printer column shows only the first value of a list, so the list cannot be the column.
//!
//! Metas touched by the watch are marked in a set (bounded by the number of metas, so no
//! change is ever dropped, unlike a full channel); one task writes the marked ones, reading
//! each fresh and writing with its resourceVersion (`get` + `update` on `/status`, the rights
//! the rollout status already needs), so it never overwrites a rollout written meanwhile.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use fleetwatch_api::ModuleReleaseMeta;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

/// Attempts per meta when the status write meets a newer resourceVersion.
const ATTEMPTS: usize = 5;

/// Marks metas whose summary may be out of date; cheap to clone.
#[derive(Clone, Default)]
pub struct ChannelsSummary {
    marked: Arc<Mutex<BTreeSet<(String, String)>>>,
    wake: Arc<tokio::sync::Notify>,
}

/// Whether `meta`'s status needs the summary written (it differs or is missing).
pub fn needs_write(meta: &ModuleReleaseMeta) -> bool {
    meta.status.as_ref().and_then(|s| s.channels.as_deref()) != Some(meta.spec.channels_summary().as_str())
}

impl ChannelsSummary {
    /// Marks `meta` if its summary is out of date (a meta seen by the watch).
    pub fn touched(&self, meta: &ModuleReleaseMeta) {
        if !needs_write(meta) {
            return;
        }
        let key = (meta.namespace().unwrap_or_default(), meta.name_any());
        if let Ok(mut m) = self.marked.lock() {
            m.insert(key);
        }
        self.wake.notify_one();
    }

    /// Writes marked metas' summaries until `shutdown`.
    pub async fn run(self, client: kube::Client, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.wake.notified() => {}
            }
            let batch: Vec<(String, String)> = match self.marked.lock() {
                Ok(mut m) => std::mem::take(&mut *m).into_iter().collect(),
                Err(_) => return,
            };
            for (ns, name) in batch {
                let api: Api<ModuleReleaseMeta> = Api::namespaced(client.clone(), &ns);
                if let Err(e) = write(&api, &name).await {
                    // The next change of the meta marks it again; a failed write is not retried
                    // in a loop (the column is for people, the operator never reads it).
                    tracing::warn!(meta = %format!("{ns}/{name}"), error = %e, "cannot write the channels summary of a ModuleReleaseMeta");
                }
            }
        }
    }
}

async fn write(api: &Api<ModuleReleaseMeta>, name: &str) -> Result<(), kube::Error> {
    for _ in 0..ATTEMPTS {
        let Some(mut meta) = api.get_opt(name).await? else { return Ok(()) };
        if !needs_write(&meta) {
            return Ok(());
        }
        let summary = meta.spec.channels_summary();
        meta.status.get_or_insert_with(Default::default).channels = Some(summary.clone());
        match api.replace_status(name, &PostParams::default(), &meta).await {
            Ok(_) => {
                tracing::debug!(meta = name, channels = %summary, "channels summary written");
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use fleetwatch_api::{ChannelVersion, ModuleReleaseMetaSpec, ModuleReleaseMetaStatus};

    use super::*;

    #[test]
    fn only_metas_whose_summary_differs_are_marked() {
        let spec = ModuleReleaseMetaSpec {
            module_name: "redis".into(),
            channels: vec![
                ChannelVersion { channel: "regular".into(), version: "1.0.0".into() },
                ChannelVersion { channel: "fast".into(), version: "2.0.0".into() },
            ],
            ..Default::default()
        };
        let mut meta = ModuleReleaseMeta::new("redis", spec);
        meta.metadata.namespace = Some("kcp".into());
        assert!(needs_write(&meta), "no status yet");
        let s = ChannelsSummary::default();
        s.touched(&meta);
        assert_eq!(s.marked.lock().unwrap().iter().collect::<Vec<_>>(), [&("kcp".to_string(), "redis".to_string())]);
        meta.status =
            Some(ModuleReleaseMetaStatus { channels: Some("fast=2.0.0 regular=1.0.0".into()), ..Default::default() });
        assert!(!needs_write(&meta), "up to date: our own write must not mark it again");
        meta.spec.channels[0].version = "1.1.0".into();
        assert!(needs_write(&meta), "a channel moved");
    }
}
