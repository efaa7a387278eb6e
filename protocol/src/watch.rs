//! What a watch selects and keeps, checked without any Kubernetes client: field names as
//! JSON pointers and label selectors in kube-apiserver's syntax. The hub checks a
//! WatchConfig with these before pushing it; the agent uses the same functions, so the two
//! can never disagree on what a valid watch is.

/// Fields that count as a change when a WatchConfig names none.
pub const DEFAULT_FIELDS: &[&str] = &["spec", "status", "metadata.labels", "metadata.annotations"];

/// Most bytes of projected fields copied into one event.
pub const MAX_PROJECTION_BYTES: usize = 16 << 10;

/// A field name or label selector that kube-apiserver would not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchSyntaxError {
    /// `""` as a field name.
    #[error("an empty field name")]
    EmptyField,
    /// A JSON pointer with a `~` not followed by `0` or `1`.
    #[error("bad JSON pointer {field:?}: '~' must be followed by 0 or 1 (RFC 6901)")]
    BadPointer {
        /// The field as given.
        field: String,
    },
    /// A dotted name with a `/` in it.
    #[error("bad field {field:?}: a JSON pointer starts with '/' (e.g. /spec/replicas); dotted names have no '/'")]
    SlashInDottedName {
        /// The field as given.
        field: String,
    },
    /// A dotted name with an empty part (`spec..x`, `.spec`).
    #[error("bad field {field:?}: use dotted names like metadata.labels or JSON pointers like /spec/replicas")]
    EmptySegment {
        /// The field as given.
        field: String,
    },
    /// Two commas in a row, or a trailing comma.
    #[error("an empty requirement (two commas, or a trailing comma)")]
    EmptyRequirement,
    /// `in` / `notin` without a parenthesised list.
    #[error("\"{op}\" needs a parenthesised list of values, e.g. (a,b), not {set:?}")]
    BadSet {
        /// `in` or `notin`.
        op: String,
        /// What followed it.
        set: String,
    },
    /// A label key prefix that is not a DNS subdomain.
    #[error("bad label key prefix {prefix:?}: a DNS subdomain (lower-case, at most 253 characters)")]
    BadKeyPrefix {
        /// The prefix before the `/`.
        prefix: String,
    },
    /// A label key name that is not a valid label name.
    #[error(
        "bad label key {key:?}: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    )]
    BadKey {
        /// The key as given.
        key: String,
    },
    /// A label value that is not valid.
    #[error(
        "bad label value {value:?}: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    )]
    BadValue {
        /// The value as given.
        value: String,
    },
}

/// Turns a field name (`spec`, `metadata.labels`, `/spec/replicas`) into a JSON pointer.
///
/// ```
/// use fleetwatch_protocol::watch::field_pointer;
/// assert_eq!(field_pointer("metadata.labels").unwrap(), "/metadata/labels");
/// assert_eq!(field_pointer("/spec/template/spec").unwrap(), "/spec/template/spec");
/// assert!(field_pointer("").is_err());
/// ```
pub fn field_pointer(field: &str) -> Result<String, WatchSyntaxError> {
    if field.is_empty() {
        return Err(WatchSyntaxError::EmptyField);
    }
    if field.starts_with('/') {
        // RFC 6901: `~` only as `~0` or `~1`.
        let mut chars = field.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(WatchSyntaxError::BadPointer { field: field.to_string() });
            }
        }
        return Ok(field.to_string());
    }
    if field.contains('/') {
        return Err(WatchSyntaxError::SlashInDottedName { field: field.to_string() });
    }
    if field.split('.').any(str::is_empty) {
        return Err(WatchSyntaxError::EmptySegment { field: field.to_string() });
    }
    Ok(format!("/{}", field.replace('~', "~0").replace('/', "~1").replace('.', "/")))
}

/// Checks a Kubernetes label selector the way kube-apiserver parses one: requirements
/// separated by commas, each `key`, `!key`, `key=value`, `key==value`, `key!=value`,
/// `key in (a,b)` or `key notin (a,b)`, with valid label keys and values.
///
/// ```
/// use fleetwatch_protocol::watch::validate_label_selector;
/// assert!(validate_label_selector("app=web,tier!=db,env in (prod,stage),!legacy").is_ok());
/// assert!(validate_label_selector("app==").is_ok()); // an empty value is a value
/// assert!(validate_label_selector("app=(web").is_err());
/// assert!(validate_label_selector("env in prod").is_err());
/// ```
pub fn validate_label_selector(sel: &str) -> Result<(), WatchSyntaxError> {
    let mut rest = sel.trim();
    if rest.is_empty() {
        return Ok(());
    }
    loop {
        // One requirement, up to a comma outside parentheses.
        let mut depth = 0i32;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        requirement(rest[..end].trim())?;
        if end == rest.len() {
            return Ok(());
        }
        rest = &rest[end + 1..];
    }
}

fn requirement(req: &str) -> Result<(), WatchSyntaxError> {
    if req.is_empty() {
        return Err(WatchSyntaxError::EmptyRequirement);
    }
    if let Some(key) = req.strip_prefix('!') {
        return label_key(key.trim());
    }
    for op in ["==", "!=", "="] {
        if let Some((k, v)) = req.split_once(op) {
            label_key(k.trim())?;
            return label_value(v.trim());
        }
    }
    for op in [" notin ", " in "] {
        if let Some((k, set)) = req.split_once(op) {
            label_key(k.trim())?;
            let set = set.trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| WatchSyntaxError::BadSet { op: op.trim().to_string(), set: set.to_string() })?;
            for v in inner.split(',') {
                label_value(v.trim())?;
            }
            return Ok(());
        }
    }
    label_key(req)
}

fn label_key(key: &str) -> Result<(), WatchSyntaxError> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty()
            || p.len() > 253
            || !p.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            }))
    {
        return Err(WatchSyntaxError::BadKeyPrefix { prefix: p.to_string() });
    }
    if name.is_empty() || !label_chars(name) {
        return Err(WatchSyntaxError::BadKey { key: key.to_string() });
    }
    Ok(())
}

fn label_value(v: &str) -> Result<(), WatchSyntaxError> {
    if v.is_empty() || label_chars(v) { Ok(()) } else { Err(WatchSyntaxError::BadValue { value: v.to_string() }) }
}

fn label_chars(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_names_become_escaped_pointers() {
        assert_eq!(field_pointer("spec").unwrap(), "/spec");
        assert_eq!(field_pointer("metadata.annotations").unwrap(), "/metadata/annotations");
        assert_eq!(field_pointer("a~b").unwrap(), "/a~0b");
        assert_eq!(field_pointer("/spec/a~1b").unwrap(), "/spec/a~1b");
    }

    #[test]
    fn bad_fields_say_what_is_wrong() {
        assert_eq!(field_pointer(""), Err(WatchSyntaxError::EmptyField));
        assert!(matches!(field_pointer("/spec/~2x"), Err(WatchSyntaxError::BadPointer { .. })));
        assert!(matches!(field_pointer("/spec/~"), Err(WatchSyntaxError::BadPointer { .. })));
        assert!(matches!(field_pointer("spec/replicas"), Err(WatchSyntaxError::SlashInDottedName { .. })));
        assert!(matches!(field_pointer("spec..x"), Err(WatchSyntaxError::EmptySegment { .. })));
        assert!(field_pointer("spec/replicas").unwrap_err().to_string().contains("starts with '/'"));
    }

    #[test]
    fn selectors_follow_kube_apiserver_syntax() {
        for good in ["", "app=web", "app.kubernetes.io/name in (a, b),!legacy", "tier!=db,env", "k==v", "x notin (a)"] {
            assert_eq!(validate_label_selector(good), Ok(()), "{good}");
        }
        type Is = fn(&WatchSyntaxError) -> bool;
        let cases: [(&str, Is); 7] = [
            ("a,,b", |e| *e == WatchSyntaxError::EmptyRequirement),
            ("k=v,", |e| *e == WatchSyntaxError::EmptyRequirement),
            ("env in prod", |e| matches!(e, WatchSyntaxError::BadSet { op, .. } if op == "in")),
            ("Bad_Prefix.io/x=y", |e| matches!(e, WatchSyntaxError::BadKeyPrefix { .. })),
            ("-x=y", |e| matches!(e, WatchSyntaxError::BadKey { .. })),
            ("app=web!", |e| matches!(e, WatchSyntaxError::BadValue { .. })),
            ("app=(web", |e| matches!(e, WatchSyntaxError::BadValue { .. })),
        ];
        for (bad, is) in cases {
            let e = validate_label_selector(bad).unwrap_err();
            assert!(is(&e), "{bad}: {e:?}");
        }
    }

    #[test]
    fn long_labels_are_refused() {
        let long = "a".repeat(64);
        assert!(matches!(validate_label_selector(&format!("{long}=x")), Err(WatchSyntaxError::BadKey { .. })));
        assert!(matches!(validate_label_selector(&format!("k={long}")), Err(WatchSyntaxError::BadValue { .. })));
        assert_eq!(validate_label_selector(&format!("k={}", "a".repeat(63))), Ok(()));
    }
}
