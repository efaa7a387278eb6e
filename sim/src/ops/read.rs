//! The read verbs: GET of one object and LIST with selectors and `limit`/`continue`.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use super::obj_key;
use crate::error::ApiError;
use crate::resources::ResourceDef;
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, State};

/// Reads an object the way a GET does, as a `Value` (for Tables; plain GETs answer with
/// `get_json`).
pub fn get(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
    st.get(&def.key(), &obj_key(def, ns, name))
        .map(|o| for_version(o, def))
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
}

/// GET's response body: the stored JSON when the object was written through the same
/// version (no clone, no serialization).
pub fn get_json(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Bytes, ApiError> {
    let key = def.key();
    let ok = obj_key(def, ns, name);
    let o = st.get(&key, &ok).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    match st.serialized(&key).and_then(|m| m.get(&ok)) {
        Some(j) if o["apiVersion"].as_str() == Some(def.api_version().as_str()) => Ok(j.clone()),
        _ => Ok(crate::store::to_json(&for_version(o, def))),
    }
}

/// The object as seen through `def`'s version (CRD versions share storage).
pub fn for_version(o: &Arc<Value>, def: &ResourceDef) -> Value {
    crate::convert::convert(o, &def.api_version())
}

/// One listed object: the stored value and its JSON as seen through the listed version.
#[derive(Debug, Clone)]
pub struct ListItem {
    pub obj: Arc<Value>,
    pub json: Bytes,
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<ListItem>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// A continue token: the resourceVersion of the first page and the last key returned.
fn encode_continue(rv: u64, last: &ObjKey) -> String {
    let raw = json!({"rv": rv, "ns": last.0, "name": last.1}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(tok: &str) -> Result<(u64, ObjKey), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tok).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    Ok((rv, (v["ns"].as_str().unwrap_or("").to_string(), v["name"].as_str().ok_or_else(bad)?.to_string())))
}

/// LIST with selectors and `limit`/`continue`. Pages are served from the current state
/// (kube-apiserver serves them from a snapshot); a continue token older than the retained
/// history is answered with 410 like an expired etcd revision.
pub fn list(
    st: &State,
    def: &ResourceDef,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    limit: Option<usize>,
    cont: Option<&str>,
) -> Result<ListPage, ApiError> {
    let (rv, after) = match cont {
        Some(tok) if !tok.is_empty() => {
            let (rv, after) = decode_continue(tok)?;
            if rv < st.floor {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                ));
            }
            (rv, Some(after))
        }
        _ => (st.rv, None),
    };
    let Some(map) = st.objects.get(&def.key()) else {
        return Ok(ListPage { items: Vec::new(), rv, continue_token: None, remaining: None });
    };
    let range: Box<dyn Iterator<Item = (&ObjKey, &Arc<Value>)>> = match (&after, ns.filter(|_| def.namespaced)) {
        (Some(a), _) => {
            Box::new(map.range::<ObjKey, _>((std::ops::Bound::Excluded(a.clone()), std::ops::Bound::Unbounded)))
        }
        (None, Some(n)) => Box::new(map.range::<ObjKey, _>((n.to_string(), String::new())..)),
        (None, None) => Box::new(map.iter()),
    };
    let serialized = st.serialized(&def.key());
    let api_version = def.api_version();
    let mut items = Vec::new();
    let mut last = None;
    let mut more = 0usize;
    for (k, o) in range {
        if let Some(n) = ns.filter(|_| def.namespaced)
            && k.0 != n
        {
            if k.0.as_str() > n {
                break;
            }
            continue;
        }
        if !labels.matches(o) || !fields.matches(o) {
            continue;
        }
        if limit.is_some_and(|l| l > 0 && items.len() >= l) {
            more += 1;
            continue;
        }
        let json = match serialized.and_then(|m| m.get(k)) {
            Some(j) if o["apiVersion"].as_str() == Some(api_version.as_str()) => j.clone(),
            _ => crate::store::to_json(&for_version(o, def)),
        };
        items.push(ListItem { obj: o.clone(), json });
        last = Some(k.clone());
    }
    let continue_token = if more > 0 { last.map(|l| encode_continue(rv, &l)) } else { None };
    Ok(ListPage { items, rv, continue_token, remaining: (more > 0).then_some(more) })
}
