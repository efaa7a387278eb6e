//! Server-side apply and field ownership (`metadata.managedFields`, FieldsV1).
//!
//! Model: a manager owns a set of leaf paths. Maps are walked key by key; lists are
//! atomic (owned as a whole), which is simpler than kube-apiserver's associative lists
//! but gives the same answers for maps, scalars and whole lists. Rules, as in
//! kube-apiserver:
//! * apply sets the manager's set to exactly the applied leaves;
//! * a leaf the manager applied before, no longer applies and nobody else owns is removed;
//! * applying a different value to a leaf another manager owns is a conflict (409) unless
//!   `force=true`, which moves ownership;
//! * applying the same value shares ownership;
//! * a non-apply write (create/update/patch) gives the changed leaves to its manager and
//!   takes them from everybody else.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// A path of object keys, e.g. `["spec", "replicas"]`.
pub type FieldPath = Vec<String>;
/// The leaves a manager owns.
pub type FieldSet = BTreeSet<FieldPath>;

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

/// Leaves of an object that field management tracks (not apiVersion, kind, or
/// server-owned metadata).
pub fn leaf_paths(obj: &Value) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else { return out };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" => {
                for m in OWNED_METADATA {
                    if let Some(mv) = v.get(m) {
                        walk(mv, &mut vec!["metadata".into(), m.into()], &mut out);
                    }
                }
            }
            _ => walk(v, &mut vec![k.clone()], &mut out),
        }
    }
    out
}

fn walk(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                path.push(k.clone());
                walk(child, path, out);
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The value at a path, if present.
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for k in path {
        cur = cur.as_object()?.get(k)?;
    }
    Some(cur)
}

fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = obj;
    for k in parents {
        match cur.as_object_mut().and_then(|m| m.get_mut(k)) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

/// Removes maps that became empty below `path`'s parents after a removal.
fn prune_empty(obj: &mut Value, path: &[String]) {
    for depth in (1..path.len()).rev() {
        let parent = &path[..depth];
        if value_at(obj, parent).and_then(Value::as_object).is_some_and(Map::is_empty) {
            remove_at(obj, parent);
        } else {
            break;
        }
    }
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// `.spec.replicas` style rendering used in conflict messages.
pub fn render_path(p: &[String]) -> String {
    p.iter().map(|k| format!(".{k}")).collect()
}

/// FieldsV1 tree of a field set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for k in path {
            let entry = cur.entry(format!("f:{k}")).or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(next) = entry else { break };
            cur = next;
        }
    }
    Value::Object(root)
}

/// Field set of a FieldsV1 tree (our own encoding; `.`, `k:`, `v:` and `i:` entries mark
/// their parent as owned as a whole).
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn rec(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        let mut leaf = m.is_empty();
        for (k, child) in m {
            if let Some(name) = k.strip_prefix("f:") {
                path.push(name.to_string());
                rec(child, path, out);
                path.pop();
            } else {
                leaf = true;
            }
        }
        if leaf && !path.is_empty() {
            out.insert(path.clone());
        }
    }
    let mut out = FieldSet::new();
    rec(v, &mut Vec::new(), &mut out);
    out
}

/// Reads `metadata.managedFields`.
pub fn read_managed(obj: &Value) -> Vec<ManagedEntry> {
    let Some(list) = obj["metadata"]["managedFields"].as_array() else { return Vec::new() };
    list.iter()
        .filter_map(|e| {
            Some(ManagedEntry {
                manager: e["manager"].as_str()?.to_string(),
                operation: e["operation"].as_str().unwrap_or("Update").to_string(),
                api_version: e["apiVersion"].as_str().unwrap_or("").to_string(),
                time: e["time"].as_str().unwrap_or("").to_string(),
                subresource: e["subresource"].as_str().map(str::to_string),
                fields: from_fields_v1(&e["fieldsV1"]),
            })
        })
        .collect()
}

/// Writes `metadata.managedFields` (entries without fields are dropped, as upstream does).
pub fn write_managed(obj: &mut Value, entries: &[ManagedEntry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Deep-merges an applied configuration into the live object: maps key by key, everything
/// else (scalars, lists) replaced.
fn merge_applied(target: &mut Value, applied: &Value) {
    match (target.as_object_mut(), applied.as_object()) {
        (Some(t), Some(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    t.remove(k);
                } else if v.is_object() && t.get(k).is_some_and(Value::is_object) {
                    if let Some(slot) = t.get_mut(k) {
                        merge_applied(slot, v);
                    }
                } else {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
        _ => *target = applied.clone(),
    }
}

/// Context of one field-managed write.
pub struct WriteCtx<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub now: &'a str,
    pub subresource: Option<&'a str>,
}

/// Server-side apply of `applied` onto `current` (None: the object does not exist yet).
/// Returns the new object with `managedFields` updated. Server-owned metadata of
/// `current` (uid, resourceVersion, …) is kept; the caller stamps the rest.
pub fn apply(current: Option<&Value>, applied: &Value, force: bool, ctx: &WriteCtx<'_>) -> Result<Value, ApiError> {
    let mut entries = current.map(read_managed).unwrap_or_default();
    let applied_fields = leaf_paths(applied);
    let is_me = |e: &ManagedEntry| {
        e.manager == ctx.manager && e.operation == "Apply" && e.subresource.as_deref() == ctx.subresource
    };

    // Conflicts: a leaf another manager owns, applied with a different value.
    let mut conflicts = Vec::new();
    if let Some(cur) = current {
        for e in entries.iter_mut().filter(|e| !is_me(e)) {
            let mut lost = Vec::new();
            for theirs in &e.fields {
                // An applied empty map only asserts that the map exists; it never conflicts.
                let asserts_value =
                    |p: &FieldPath| !value_at(applied, p).and_then(Value::as_object).is_some_and(Map::is_empty);
                for mine in applied_fields.iter().filter(|m| overlaps(m, theirs) && asserts_value(m)) {
                    let same = value_at(cur, mine) == value_at(applied, mine)
                        && value_at(cur, theirs) == value_at(applied, theirs);
                    if !same {
                        lost.push(theirs.clone());
                        conflicts.push((e.manager.clone(), render_path(mine)));
                    }
                }
            }
            if force {
                for p in lost {
                    e.fields.remove(&p);
                }
            }
        }
    }
    if !force && !conflicts.is_empty() {
        conflicts.sort();
        conflicts.dedup();
        return Err(ApiError::apply_conflict(&conflicts));
    }

    let mut obj = match current {
        Some(c) => c.clone(),
        None => json!({"metadata": {}}),
    };
    // Fields this manager applied before but not now, and nobody else owns: removed.
    let previous: FieldSet = entries.iter().filter(|e| is_me(e)).flat_map(|e| e.fields.iter().cloned()).collect();
    for p in previous.difference(&applied_fields) {
        let owned_elsewhere = entries.iter().filter(|e| !is_me(e)).any(|e| e.fields.iter().any(|q| overlaps(p, q)));
        let still_applied = applied_fields.iter().any(|q| overlaps(p, q));
        if !owned_elsewhere && !still_applied {
            remove_at(&mut obj, p);
            prune_empty(&mut obj, p);
        }
    }
    let mut applied_body = applied.clone();
    if let Some(m) = applied_body.get_mut("metadata").and_then(Value::as_object_mut) {
        // Only the owned metadata fields are taken from an apply body.
        m.retain(|k, _| OWNED_METADATA.contains(&k.as_str()));
    }
    merge_applied(&mut obj, &applied_body);

    entries.retain(|e| !is_me(e));
    entries.push(ManagedEntry {
        manager: ctx.manager.to_string(),
        operation: "Apply".into(),
        api_version: ctx.api_version.to_string(),
        time: ctx.now.to_string(),
        subresource: ctx.subresource.map(str::to_string),
        fields: applied_fields,
    });
    write_managed(&mut obj, &entries);
    Ok(obj)
}

/// Records a non-apply write: the leaves that changed between `old` and `new` move to
/// `ctx.manager` (operation `Update`).
pub fn track_update(old: Option<&Value>, new: &mut Value, ctx: &WriteCtx<'_>) {
    let mut entries = old.map(read_managed).unwrap_or_default();
    let new_leaves = leaf_paths(new);
    let old_leaves = old.map(leaf_paths).unwrap_or_default();
    let changed: FieldSet =
        new_leaves.iter().filter(|p| old.and_then(|o| value_at(o, p)) != value_at(new, p)).cloned().collect();
    let removed: FieldSet = old_leaves.difference(&new_leaves).cloned().collect();
    let is_me = |e: &ManagedEntry| {
        e.manager == ctx.manager && e.operation == "Update" && e.subresource.as_deref() == ctx.subresource
    };
    for e in entries.iter_mut() {
        let mine = is_me(e);
        e.fields.retain(|p| {
            let gone = removed.iter().any(|r| overlaps(p, r)) && value_at(new, p).is_none();
            let taken = !mine && changed.iter().any(|c| overlaps(p, c));
            !(gone || taken)
        });
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| is_me(e)) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = ctx.now.to_string();
                e.api_version = ctx.api_version.to_string();
            }
            None => entries.push(ManagedEntry {
                manager: ctx.manager.to_string(),
                operation: "Update".into(),
                api_version: ctx.api_version.to_string(),
                time: ctx.now.to_string(),
                subresource: ctx.subresource.map(str::to_string),
                fields: changed,
            }),
        }
    }
    write_managed(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(m: &str) -> WriteCtx<'_> {
        WriteCtx { manager: m, api_version: "v1", now: "2025-01-01T00:00:00Z", subresource: None }
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d"}, "data": data})
    }

    #[test]
    fn apply_creates_and_records_owner() {
        let o = apply(None, &cm(json!({"a": "1"})), false, &ctx("alice")).unwrap();
        assert_eq!(o["data"]["a"], "1");
        let m = read_managed(&o);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].manager, "alice");
        assert_eq!(m[0].operation, "Apply");
        assert_eq!(o["metadata"]["managedFields"][0]["fieldsV1"], json!({"f:data": {"f:a": {}}}));
    }

    #[test]
    fn conflict_unless_forced_and_shared_when_equal() {
        let o = apply(None, &cm(json!({"a": "1"})), false, &ctx("alice")).unwrap();
        let e = apply(Some(&o), &cm(json!({"a": "2"})), false, &ctx("bob")).unwrap_err();
        assert_eq!(e.code, 409);
        assert!(e.message.contains("alice") && e.message.contains(".data.a"), "{}", e.message);
        // Same value: shared ownership, no conflict.
        let shared = apply(Some(&o), &cm(json!({"a": "1"})), false, &ctx("bob")).unwrap();
        assert_eq!(read_managed(&shared).len(), 2);
        // Forced: bob takes it, alice no longer owns anything, so her entry goes.
        let forced = apply(Some(&o), &cm(json!({"a": "2"})), true, &ctx("bob")).unwrap();
        assert_eq!(forced["data"]["a"], "2");
        let m = read_managed(&forced);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].manager, "bob");
    }

    #[test]
    fn dropping_a_field_removes_it_unless_shared() {
        let o = apply(None, &cm(json!({"a": "1", "b": "2"})), false, &ctx("alice")).unwrap();
        let o = apply(Some(&o), &cm(json!({"a": "1"})), false, &ctx("alice")).unwrap();
        assert_eq!(o["data"], json!({"a": "1"}));
        let o = apply(Some(&o), &cm(json!({"a": "1"})), false, &ctx("bob")).unwrap();
        let o = apply(Some(&o), &cm(json!({})), false, &ctx("alice")).unwrap();
        assert_eq!(o["data"], json!({"a": "1"}), "bob still owns .data.a");
    }

    #[test]
    fn update_takes_ownership() {
        let o = apply(None, &cm(json!({"a": "1"})), false, &ctx("alice")).unwrap();
        let mut n = o.clone();
        n["data"]["a"] = json!("9");
        track_update(Some(&o), &mut n, &ctx("editor"));
        let m = read_managed(&n);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].manager, "editor");
        assert_eq!(m[0].operation, "Update");
        // Alice re-applying her old value now conflicts with the editor.
        assert_eq!(apply(Some(&n), &cm(json!({"a": "1"})), false, &ctx("alice")).unwrap_err().code, 409);
    }

    #[test]
    fn fields_v1_round_trip() {
        let set: FieldSet =
            [vec!["spec".to_string(), "replicas".to_string()], vec!["metadata".into(), "labels".into(), "app".into()]]
                .into_iter()
                .collect();
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
    }
}
