//! What a watch selects and keeps, checked without any Kubernetes client: field names as
//! JSON pointers and label selectors in kube-apiserver's syntax. The hub checks a
//! WatchConfig with these before pushing it; the agent uses the same functions, so the two
//! can never disagree on what a valid watch is.

/// Fields that count as a change when a WatchConfig names none.
pub const DEFAULT_FIELDS: &[&str] = &["spec", "status", "metadata.labels", "metadata.annotations"];

/// Most bytes of projected fields copied into one event.
pub const MAX_PROJECTION_BYTES: usize = 16 << 10;

/// Turns a field name (`spec`, `metadata.labels`, `/spec/replicas`) into a JSON pointer.
///
/// ```
/// use fleetwatch_protocol::watch::field_pointer;
/// assert_eq!(field_pointer("metadata.labels").unwrap(), "/metadata/labels");
/// assert_eq!(field_pointer("/spec/template/spec").unwrap(), "/spec/template/spec");
/// assert!(field_pointer("").is_err());
/// ```
pub fn field_pointer(field: &str) -> Result<String, String> {
    if field.is_empty() {
        return Err("an empty field name".into());
    }
    if field.starts_with('/') {
        // RFC 6901: `~` only as `~0` or `~1`.
        let mut chars = field.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return Err(format!("bad JSON pointer {field:?}: '~' must be followed by 0 or 1 (RFC 6901)"));
            }
        }
        return Ok(field.to_string());
    }
    if field.contains('/') {
        return Err(format!(
            "bad field {field:?}: a JSON pointer starts with '/' (e.g. /spec/replicas); dotted names have no '/'"
        ));
    }
    if field.split('.').any(str::is_empty) {
        return Err(format!(
            "bad field {field:?}: use dotted names like metadata.labels or JSON pointers like /spec/replicas"
        ));
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
pub fn validate_label_selector(sel: &str) -> Result<(), String> {
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

fn requirement(req: &str) -> Result<(), String> {
    if req.is_empty() {
        return Err("an empty requirement (two commas, or a trailing comma)".into());
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
                .ok_or_else(|| format!("{op:?} needs a parenthesised list of values, e.g. (a,b), not {set:?}"))?;
            for v in inner.split(',') {
                label_value(v.trim())?;
            }
            return Ok(());
        }
    }
    label_key(req)
}

fn label_key(key: &str) -> Result<(), String> {
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
        return Err(format!("bad label key prefix {p:?}: a DNS subdomain (lower-case, at most 253 characters)"));
    }
    if name.is_empty() || !label_chars(name) {
        return Err(format!(
            "bad label key {key:?}: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || label_chars(v) {
        Ok(())
    } else {
        Err(format!(
            "bad label value {v:?}: at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

fn label_chars(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}
