//! Background controllers of the simulated cluster: the garbage collector (dependents
//! whose owners are all gone are deleted; foreground deletion waits for dependents) and
//! the namespace controller (a terminating namespace is emptied, then removed).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::Core;
use crate::meta::{self, finalizers, meta_str};
use crate::ops::{self, DeleteOpts, NAMESPACES};
use crate::store::{ObjKey, State};

/// Runs until shutdown, after every write that may have orphaned something (woken by the
/// handlers, and every `period` for writes that do not wake it).
pub async fn run(core: Arc<Core>, period: Duration) {
    loop {
        tokio::select! {
            _ = core.shutdown.cancelled() => return,
            _ = core.gc_wake.notified() => {}
            _ = tokio::time::sleep(period) => {}
        }
        let mut st = core.lock();
        // Only writes that can orphan something or finish a deletion (see
        // `State::gc_pending`) call for a pass over every object; a steady stream of
        // plain updates does not.
        if !st.gc_pending {
            continue;
        }
        let _span = tracing::debug_span!("gc").entered();
        // Each pass can make new orphans; repeat until nothing changes.
        let mut converged = false;
        for _ in 0..16 {
            if !pass(&mut st) {
                converged = true;
                break;
            }
        }
        st.gc_pending = !converged;
    }
}

/// One pass over all objects. Returns whether it changed anything.
pub fn pass(st: &mut State) -> bool {
    let live: HashSet<String> =
        st.objects.values().flat_map(|m| m.values()).map(|o| meta_str(o, "uid").to_string()).collect();
    let mut orphans: Vec<(String, ObjKey)> = Vec::new();
    let mut foreground_done: Vec<(String, ObjKey, Arc<Value>)> = Vec::new();
    let mut owners_waiting: HashSet<String> = HashSet::new();
    for (key, map) in &st.objects {
        for (ok, o) in map {
            let owners = meta::owner_uids(o);
            if !owners.is_empty()
                && owners.iter().all(|u| !live.contains(u))
                && meta_str(o, "deletionTimestamp").is_empty()
            {
                orphans.push((key.clone(), ok.clone()));
            }
            if !meta_str(o, "deletionTimestamp").is_empty() && finalizers(o).iter().any(|f| f == "foregroundDeletion") {
                owners_waiting.insert(meta_str(o, "uid").to_string());
                foreground_done.push((key.clone(), ok.clone(), o.clone()));
            }
        }
    }
    // Dependents of owners in foreground deletion are deleted first.
    for (key, map) in &st.objects {
        for (ok, o) in map {
            if meta_str(o, "deletionTimestamp").is_empty()
                && meta::owner_uids(o).iter().any(|u| owners_waiting.contains(u))
            {
                orphans.push((key.clone(), ok.clone()));
            }
        }
    }
    let mut changed = false;
    for (key, ok) in orphans {
        let Some(def) = st.registry.any_version(&key).cloned() else { continue };
        let ns = (!ok.0.is_empty()).then_some(ok.0.clone());
        tracing::debug!(resource = %key, name = %ok.1, "garbage collecting dependent");
        if ops::delete(st, &def, ns.as_deref(), &ok.1, &DeleteOpts::default()).is_ok() {
            changed = true;
        }
    }
    for (key, ok, o) in foreground_done {
        let uid = meta_str(&o, "uid");
        if ops::has_dependents(st, uid) {
            continue;
        }
        let mut n = (*o).clone();
        let rest: Vec<String> = finalizers(&o).into_iter().filter(|f| f != "foregroundDeletion").collect();
        n["metadata"]["finalizers"] = json!(rest);
        if rest.is_empty() {
            ops::remove(st, &key, ok, Some(Arc::new(n)));
        } else {
            st.commit(&key, ok, Some(n), None);
        }
        changed = true;
    }
    changed |= namespaces(st);
    changed
}

/// Empties terminating namespaces and removes the empty ones.
fn namespaces(st: &mut State) -> bool {
    let terminating: Vec<(ObjKey, Arc<Value>)> = st
        .all(NAMESPACES)
        .filter(|(_, o)| !meta_str(o, "deletionTimestamp").is_empty())
        .map(|(k, o)| (k.clone(), o.clone()))
        .collect();
    let mut changed = false;
    for (nk, nso) in terminating {
        let ns = nk.1.clone();
        let mut left = 0;
        for key in st.registry.namespaced_keys() {
            let names: Vec<(String, bool)> = st
                .all(&key)
                .filter(|(k, _)| k.0 == ns)
                .map(|(k, o)| (k.1.clone(), !meta_str(o, "deletionTimestamp").is_empty()))
                .collect();
            left += names.len();
            let Some(def) = st.registry.any_version(&key).cloned() else { continue };
            for (name, deleting) in names {
                if !deleting && ops::delete(st, &def, Some(&ns), &name, &DeleteOpts::default()).is_ok() {
                    changed = true;
                }
            }
        }
        if left == 0 && finalizers(&nso).is_empty() {
            ops::remove(st, NAMESPACES, nk, None);
            changed = true;
        }
    }
    changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{WriteOpts, create, get};

    #[test]
    fn dependents_of_deleted_owner_are_collected() {
        let mut st = State::new(100);
        let nsd = st.registry.get("", "v1", "namespaces").cloned().unwrap();
        create(&mut st, &nsd, None, json!({"metadata": {"name": "d"}}), &WriteOpts::default()).unwrap();
        let cm = st.registry.get("", "v1", "configmaps").cloned().unwrap();
        let owner =
            create(&mut st, &cm, Some("d"), json!({"metadata": {"name": "owner"}}), &WriteOpts::default()).unwrap();
        let oref = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}]);
        create(
            &mut st,
            &cm,
            Some("d"),
            json!({"metadata": {"name": "dep", "ownerReferences": oref}}),
            &WriteOpts::default(),
        )
        .unwrap();
        assert!(!pass(&mut st), "nothing to do while the owner lives");
        ops::delete(&mut st, &cm, Some("d"), "owner", &DeleteOpts::default()).unwrap();
        assert!(pass(&mut st));
        assert_eq!(get(&st, &cm, Some("d"), "dep").unwrap_err().code, 404);
    }

    #[test]
    fn terminating_namespace_is_emptied_then_removed() {
        let mut st = State::new(100);
        let nsd = st.registry.get("", "v1", "namespaces").cloned().unwrap();
        create(&mut st, &nsd, None, json!({"metadata": {"name": "d"}}), &WriteOpts::default()).unwrap();
        let cm = st.registry.get("", "v1", "configmaps").cloned().unwrap();
        create(&mut st, &cm, Some("d"), json!({"metadata": {"name": "a"}}), &WriteOpts::default()).unwrap();
        let ns = ops::delete(&mut st, &nsd, None, "d", &DeleteOpts::default()).unwrap();
        assert_eq!(ns["status"]["phase"], "Terminating");
        while pass(&mut st) {}
        assert_eq!(get(&st, &cm, Some("d"), "a").unwrap_err().code, 404);
        assert_eq!(get(&st, &nsd, None, "d").unwrap_err().code, 404);
    }
}
