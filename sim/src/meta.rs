//! Small helpers for object metadata: timestamps, uids, names.

use serde_json::Value;

/// Now as an RFC 3339 timestamp with second precision, as Kubernetes writes them.
pub fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A random version-4 UUID, the format of `metadata.uid`.
pub fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Five random lowercase alphanumerics, the suffix `generateName` gets.
pub fn random_suffix() -> String {
    const CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5).map(|_| CHARS[rand::random_range(0..CHARS.len())] as char).collect()
}

/// Whether `name` is a valid DNS-1123 subdomain (what most kinds require of names).
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// `metadata.<field>` as a string, or "".
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or("")
}

/// `metadata.finalizers`, empty when absent.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Owner uids from `metadata.ownerReferences`.
pub fn owner_uids(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["uid"].as_str().map(str::to_string)).collect())
        .unwrap_or_default()
}

/// Mutable `metadata` map, created when missing.
pub fn meta_mut(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = Value::Object(Default::default());
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_shape() {
        let u = new_uid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert_ne!(u, new_uid());
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("widgets.example.com"));
        assert!(!is_dns_subdomain("Upper"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain(""));
    }

    #[test]
    fn timestamp_format() {
        let t = now();
        assert!(t.ends_with('Z') && t.len() == 20, "{t}");
    }
}
