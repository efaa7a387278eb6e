//! Kubernetes label selectors in their string form (`team=a,env in (prod),!legacy`): `=`,
//! `==`, `!=`, `in`, `notin`, exists and `!`exists. One parser for the simulated API
//! server's `labelSelector` parameter and the hub's access policy `clusterSelector`.

use std::collections::BTreeMap;

/// One requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

/// Why a selector cannot be parsed (kube-apiserver's wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement: {why} (selector {selector:?})")]
pub struct SelectorError {
    /// The selector as given.
    pub selector: String,
    /// What is wrong.
    pub why: String,
}

/// Splits at commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn bad(sel: &str, why: &str) -> SelectorError {
    SelectorError { selector: sel.to_string(), why: why.to_string() }
}

fn parse_set(sel: &str, rest: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad(sel, "found '(' expected: set of values"))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect())
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    /// Parses a selector string.
    pub fn parse(sel: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if sel.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(sel) {
            let part = part.trim();
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), parse_set(sel, rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), parse_set(sel, rest)?)
            } else {
                Req::Exists(part.to_string())
            };
            let key = match &req {
                Req::Eq(k, _)
                | Req::NotEq(k, _)
                | Req::In(k, _)
                | Req::NotIn(k, _)
                | Req::Exists(k)
                | Req::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad(sel, &format!("invalid label key {key:?}")));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether it has no requirement (and so matches everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether labels looked up with `get` satisfy every requirement.
    pub fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }

    /// Whether these labels satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_matches_every_operator() {
        let labels: BTreeMap<String, String> =
            [("team", "a"), ("env", "prod")].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for (sel, want) in [
            ("team=a", true),
            ("team==a,env in (prod, stage)", true),
            ("team!=a", false),
            ("env notin (prod)", false),
            ("team,!legacy", true),
            ("legacy", false),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&labels), want, "{sel}");
        }
        let err = LabelSelector::parse("env in prod").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unable to parse requirement: found '(' expected: set of values (selector \"env in prod\")"
        );
        assert!(LabelSelector::parse("te am=a").is_err());
    }
}
