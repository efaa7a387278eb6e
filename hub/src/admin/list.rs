//! Paged, filtered lists of the admin API, in the manner of the Kubernetes API:
//! `?limit=N&continue=TOKEN`, filters (`connected=false`, `watchPhase=failed`,
//! `labelSelector=` on Runtimes, `q=` for a substring of the name) and an order
//! (`order=name`, or `order=problems`: disconnected clusters, then failing watches, then
//! modules not ready, each by name).
//!
//! A continue token is opaque to clients: it carries the sort key of the last item
//! returned and a fingerprint of the filters and order it was issued for. The next page
//! starts after that key in the list as it is *now*, so paging is stable under concurrent
//! change (nothing is held between requests and a token never expires): an item added or
//! removed meanwhile is seen or not depending on where it sorts, the others exactly once,
//! unless their sort key itself changed (with `order=problems`, a cluster that became
//! disconnected moves ahead). A token that is not one of ours, or was issued for other
//! filters, is refused with 400 and the reason.
//!
//! Without `limit`, a list is answered whole as before, up to [`UNPAGED_MAX`] items; a
//! larger list is refused with 400 telling to page, rather than cut silently (a client that
//! does not page would take a part for the whole fleet).

use std::collections::HashMap;

use fleetwatch_api::label_selector::LabelSelector;

/// Most items one page may ask for (`limit` above it is lowered to it).
pub(crate) const MAX_LIMIT: usize = 5_000;
/// Most items of a list answered without `limit`.
pub(crate) const UNPAGED_MAX: usize = 10_000;

/// A request the admin API refuses, with the reason (answered as 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct BadRequest(pub String);

/// How a list is ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Order {
    /// By name (cluster id, or `namespace/name` of a Runtime).
    #[default]
    Name,
    /// Problems first (see the module documentation), then by name.
    Problems,
}

/// Which watches a cluster must have to be listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PhaseFilter {
    /// At least one failing watch (any phase but running, starting, waiting-for-kind).
    Failed,
    /// At least one watch in this phase (its wire name, e.g. `forbidden`).
    Phase(String),
}

/// The query of a list request, parsed and checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListQuery {
    /// Items per page (`None`: the whole list, up to [`UNPAGED_MAX`]).
    pub(crate) limit: Option<usize>,
    /// Where the previous page stopped.
    pub(crate) after: Option<SortKey>,
    /// Only clusters whose agent is (not) connected.
    pub(crate) connected: Option<bool>,
    /// Only clusters with such a watch.
    pub(crate) watch_phase: Option<PhaseFilter>,
    /// Only Runtimes whose labels match.
    pub(crate) label_selector: Option<LabelSelector>,
    /// Only items whose name contains this (case-insensitive).
    pub(crate) q: Option<String>,
    /// The order of the list.
    pub(crate) order: Order,
    /// Fingerprint of the filters and order (continue tokens are tied to it).
    fingerprint: u64,
}

/// Where an item sorts: its problem rank (0 first; always 0 with [`Order::Name`]) and name.
pub(crate) type SortKey = (u8, String);

/// Query parameters a list understands; others are refused (a misspelt filter would
/// otherwise list everything).
const KNOWN: &[&str] = &["limit", "continue", "connected", "watchPhase", "labelSelector", "q", "order"];

/// Watch phases `watchPhase=` accepts besides `failed` (the agent's wire names).
const PHASES: &[&str] = &["running", "starting", "waiting-for-kind", "kind-not-found", "forbidden", "error", "failed"];

impl ListQuery {
    /// Parses the query parameters of a list; `allowed` are the filters this list has
    /// (besides `limit`, `continue`, `q` and `order`).
    pub(crate) fn parse(params: &HashMap<String, String>, allowed: &[&str]) -> Result<Self, BadRequest> {
        let mut q = ListQuery::default();
        for key in params.keys() {
            let general = ["limit", "continue", "q", "order"].contains(&key.as_str());
            if !KNOWN.contains(&key.as_str()) || !(general || allowed.contains(&key.as_str())) {
                let mut all: Vec<&str> = vec!["limit", "continue", "q", "order"];
                all.extend(allowed);
                return Err(BadRequest(format!("unknown query parameter {key:?}: this list takes {}", all.join(", "))));
            }
        }
        if let Some(l) = params.get("limit") {
            let n: usize = l
                .parse()
                .map_err(|_| BadRequest(format!("limit={l:?}: expected a whole number from 1 to {MAX_LIMIT}")))?;
            if n == 0 {
                return Err(BadRequest(format!(
                    "limit=0: expected a whole number from 1 to {MAX_LIMIT} (counts alone: /api/v1/summary)"
                )));
            }
            q.limit = Some(n.min(MAX_LIMIT));
        }
        if let Some(c) = params.get("connected") {
            q.connected = Some(match c.as_str() {
                "true" => true,
                "false" => false,
                other => return Err(BadRequest(format!("connected={other:?}: expected true or false"))),
            });
        }
        if let Some(p) = params.get("watchPhase") {
            if !PHASES.contains(&p.as_str()) {
                return Err(BadRequest(format!("watchPhase={p:?}: expected one of {}", PHASES.join(", "))));
            }
            q.watch_phase = Some(if p == "failed" { PhaseFilter::Failed } else { PhaseFilter::Phase(p.clone()) });
        }
        if let Some(s) = params.get("labelSelector") {
            let sel = LabelSelector::parse(s).map_err(|e| BadRequest(format!("labelSelector: {e}")))?;
            q.label_selector = Some(sel);
        }
        if let Some(text) = params.get("q").map(|t| t.trim().to_lowercase()).filter(|t| !t.is_empty()) {
            q.q = Some(text);
        }
        q.order = match params.get("order").map(String::as_str) {
            None | Some("name") => Order::Name,
            Some("problems") => Order::Problems,
            Some(other) => return Err(BadRequest(format!("order={other:?}: expected name or problems"))),
        };
        q.fingerprint = fingerprint(params);
        if let Some(token) = params.get("continue").filter(|t| !t.is_empty()) {
            q.after = Some(decode_token(token, q.fingerprint)?);
            if q.limit.is_none() {
                return Err(BadRequest("continue without limit: give the limit of the first page again".into()));
            }
        }
        Ok(q)
    }

    /// Whether a name passes `q`.
    pub(crate) fn name_matches(&self, name: &str) -> bool {
        self.q.as_ref().is_none_or(|q| name.to_lowercase().contains(q))
    }

    /// One page of `items` (already filtered): sorted by `key`, starting after the token's
    /// key, at most `limit` long.
    pub(crate) fn page<T>(&self, mut items: Vec<T>, key: impl Fn(&T) -> SortKey) -> Result<Page<T>, BadRequest> {
        let what = |t: &T| {
            let (rank, name) = key(t);
            (if self.order == Order::Problems { rank } else { 0 }, name)
        };
        let Some(limit) = self.limit else {
            if items.len() > UNPAGED_MAX {
                return Err(BadRequest(format!(
                    "{} items match, more than {UNPAGED_MAX} answered without paging: ask with ?limit=N (at most \
                     {MAX_LIMIT}) and follow metadata.continue, or for counts alone /api/v1/summary",
                    items.len()
                )));
            }
            let mut keyed: Vec<(SortKey, T)> = items.into_iter().map(|t| (what(&t), t)).collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            return Ok(Page { items: keyed.into_iter().map(|(_, t)| t).collect(), cont: None, remaining: 0 });
        };
        if let Some(after) = &self.after {
            items.retain(|t| what(t) > *after);
        }
        let mut keyed: Vec<(SortKey, T)> = items.into_iter().map(|t| (what(&t), t)).collect();
        // Only the first `limit` need sorting.
        if keyed.len() > limit {
            keyed.select_nth_unstable_by(limit, |a, b| a.0.cmp(&b.0));
        }
        let remaining = keyed.len().saturating_sub(limit);
        keyed.truncate(limit);
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let cont = match keyed.last() {
            Some((k, _)) if remaining > 0 => Some(encode_token(k, self.fingerprint)),
            _ => None,
        };
        Ok(Page { items: keyed.into_iter().map(|(_, t)| t).collect(), cont, remaining })
    }
}

/// One page of a list.
#[derive(Debug)]
pub(crate) struct Page<T> {
    /// The items of this page, in order.
    pub(crate) items: Vec<T>,
    /// The token for the next page (`None`: this was the last).
    pub(crate) cont: Option<String>,
    /// Items after this page (that match now).
    pub(crate) remaining: usize,
}

impl<T> Page<T> {
    /// The list's `metadata` as the Kubernetes API spells it.
    pub(crate) fn metadata(&self) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        if let Some(c) = &self.cont {
            m.insert("continue".into(), c.clone().into());
            m.insert("remainingItemCount".into(), self.remaining.into());
        }
        serde_json::Value::Object(m)
    }
}

/// FNV-1a of the filters and order (not `limit` or `continue`): the same filters give the
/// same value in every replica and release.
fn fingerprint(params: &HashMap<String, String>) -> u64 {
    let mut h = fleetwatch_protocol::digest::Fnv1a::new();
    for key in ["connected", "watchPhase", "labelSelector", "q", "order"] {
        let v = params.get(key).map(String::as_str).unwrap_or_default();
        h = h.update(key.as_bytes()).update(&[0]).update(v.as_bytes()).update(&[0]);
    }
    h.finish()
}

/// `v1.` and the hex of a small JSON document: opaque to clients, readable for us.
fn encode_token(key: &SortKey, fingerprint: u64) -> String {
    let doc = serde_json::json!({ "f": format!("{fingerprint:016x}"), "r": key.0, "k": key.1 });
    format!("v1.{}", hex::encode(doc.to_string()))
}

fn decode_token(token: &str, fingerprint: u64) -> Result<SortKey, BadRequest> {
    let bad =
        || BadRequest("continue: not a token this hub issued (take metadata.continue of the previous page)".into());
    let hex = token.strip_prefix("v1.").ok_or_else(bad)?;
    if hex.len() % 2 != 0 || hex.len() > 4096 {
        return Err(bad());
    }
    let bytes = hex::decode(hex).map_err(|_| bad())?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    let (Some(f), Some(rank), Some(name)) = (doc["f"].as_str(), doc["r"].as_u64(), doc["k"].as_str()) else {
        return Err(bad());
    };
    if f != format!("{fingerprint:016x}") {
        return Err(BadRequest(
            "continue: the token was issued for other filters or another order; ask again without continue".into(),
        ));
    }
    Ok((u8::try_from(rank).map_err(|_| bad())?, name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c-{i:05}")).collect()
    }

    fn key(s: &str) -> SortKey {
        (u8::from(!s.ends_with('7')), s.to_string())
    }

    /// Every page until the end, each asked with the token of the one before.
    fn all_pages(list: impl Fn() -> Vec<String>, base: &[(&str, &str)]) -> Vec<Vec<String>> {
        let mut pages = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut p = params(base);
            if let Some(t) = &token {
                p.insert("continue".into(), t.clone());
            }
            let q = ListQuery::parse(&p, &["connected"]).unwrap();
            let page = q.page(list(), |s| key(s)).unwrap();
            pages.push(page.items);
            match page.cont {
                Some(t) => token = Some(t),
                None => return pages,
            }
        }
    }

    #[test]
    fn pages_cover_the_list_once_in_order() {
        let pages = all_pages(|| names(25), &[("limit", "10")]);
        assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
        assert_eq!(pages.concat(), names(25));
        // Problems first: the ranks order the pages, names within a rank.
        let pages = all_pages(|| names(25), &[("limit", "2"), ("order", "problems")]);
        let flat = pages.concat();
        assert_eq!(flat[..3], ["c-00007", "c-00017", "c-00000"]);
        assert_eq!(flat.len(), 25);
    }

    #[test]
    fn a_token_resumes_after_its_key_while_the_list_changes() {
        let q = ListQuery::parse(&params(&[("limit", "3")]), &[]).unwrap();
        let first = q.page(names(10), |s| key(s)).unwrap();
        assert_eq!(first.items, ["c-00000", "c-00001", "c-00002"]);
        assert_eq!(first.remaining, 7);
        // Meanwhile c-00001 and c-00003 go and c-00002a comes: the next page starts right
        // after the last key returned, skipping nothing that remains and repeating nothing.
        let mut now = names(10);
        now.retain(|n| n != "c-00001" && n != "c-00003");
        now.push("c-00002a".into());
        let p = params(&[("limit", "3"), ("continue", first.cont.as_deref().unwrap())]);
        let second = ListQuery::parse(&p, &[]).unwrap().page(now, |s| key(s)).unwrap();
        assert_eq!(second.items, ["c-00002a", "c-00004", "c-00005"]);
        assert_eq!(second.remaining, 4);
    }

    #[test]
    fn bad_tokens_and_filters_are_refused_with_the_reason() {
        let err =
            |pairs: &[(&str, &str)]| ListQuery::parse(&params(pairs), &["connected", "watchPhase"]).unwrap_err().0;
        assert!(err(&[("limit", "x")]).contains("limit=\"x\""));
        assert!(err(&[("limit", "0")]).contains("/api/v1/summary"));
        assert!(err(&[("connected", "maybe")]).contains("expected true or false"));
        assert!(err(&[("watchPhase", "sleepy")]).contains("expected one of"));
        assert!(err(&[("labelSelector", "a")]).contains("unknown query parameter \"labelSelector\""));
        assert!(err(&[("limit", "5"), ("continue", "garbage")]).contains("not a token this hub issued"));
        assert!(err(&[("limit", "5"), ("continue", "v1.7b7d")]).contains("not a token this hub issued"));
        let sel = ListQuery::parse(&params(&[("labelSelector", "app in (a,")]), &["labelSelector"]).unwrap_err();
        assert!(sel.0.starts_with("labelSelector: unable to parse requirement"), "{sel}");
        // A token is tied to its filters.
        let q = ListQuery::parse(&params(&[("limit", "1"), ("connected", "true")]), &["connected"]).unwrap();
        let token = q.page(names(3), |s| key(s)).unwrap().cont.unwrap();
        assert!(err(&[("limit", "1"), ("connected", "false"), ("continue", &token)]).contains("other filters"));
        assert!(err(&[("continue", &token), ("connected", "true")]).contains("continue without limit"));
        // The limit has a maximum.
        let q = ListQuery::parse(&params(&[("limit", "999999")]), &[]).unwrap();
        assert_eq!(q.limit, Some(MAX_LIMIT));
    }

    #[test]
    fn an_unpaged_list_is_whole_up_to_its_bound() {
        let q = ListQuery::parse(&params(&[]), &[]).unwrap();
        let page = q.page(names(UNPAGED_MAX), |s| key(s)).unwrap();
        assert_eq!((page.items.len(), page.cont), (UNPAGED_MAX, None));
        let e = q.page(names(UNPAGED_MAX + 1), |s| key(s)).unwrap_err();
        assert!(e.0.contains("?limit=N"), "{e}");
    }

    #[test]
    fn q_matches_part_of_a_name_in_any_case() {
        let q = ListQuery::parse(&params(&[("q", " EU-West ")]), &[]).unwrap();
        assert!(q.name_matches("prod-eu-west-1") && !q.name_matches("prod-us-east-1"));
        assert!(ListQuery::parse(&params(&[]), &[]).unwrap().name_matches("anything"));
    }
}
