//! Just enough of the protobuf wire format to read the few request bodies kubectl sends
//! as `application/vnd.kubernetes.protobuf` to the authorization and token endpoints
//! (`SelfSubjectAccessReview`, `SelfSubjectRulesReview`, `SelfSubjectReview`, `TokenRequest`), turned into the
//! JSON those types have. Kubernetes wraps every protobuf object in a `runtime.Unknown`
//! envelope behind the magic bytes `k8s\0`.

use serde_json::{Map, Value, json};

/// One decoded field: number and value (varint or length-delimited bytes).
#[derive(Debug, Clone, PartialEq)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        out |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

/// All fields of a message, in order; None when the bytes are not a protobuf message.
fn fields(b: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < b.len() {
        let key = varint(b, &mut pos)?;
        let (num, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((num, Field::Varint(varint(b, &mut pos)?))),
            1 => pos = pos.checked_add(8).filter(|p| *p <= b.len())?,
            2 => {
                let len = usize::try_from(varint(b, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= b.len())?;
                out.push((num, Field::Bytes(&b[pos..end])));
                pos = end;
            }
            5 => pos = pos.checked_add(4).filter(|p| *p <= b.len())?,
            _ => return None,
        }
    }
    Some(out)
}

fn string(f: &Field<'_>) -> Option<String> {
    match f {
        Field::Bytes(b) => std::str::from_utf8(b).ok().map(str::to_string),
        Field::Varint(_) => None,
    }
}

fn message<'a>(f: &Field<'a>) -> Option<Vec<(u64, Field<'a>)>> {
    match f {
        Field::Bytes(b) => fields(b),
        Field::Varint(_) => None,
    }
}

/// Strings of a message by field number, as a JSON object with the given names.
fn strings(msg: &[(u64, Field<'_>)], names: &[(u64, &str)]) -> Map<String, Value> {
    let mut out = Map::new();
    for (num, f) in msg {
        if let Some((_, name)) = names.iter().find(|(n, _)| n == num)
            && let Some(s) = string(f)
        {
            out.insert((*name).to_string(), json!(s));
        }
    }
    out
}

/// `ObjectMeta` name and namespace (fields 1 and 3).
fn meta(msg: &[(u64, Field<'_>)]) -> Value {
    Value::Object(strings(msg, &[(1, "name"), (3, "namespace")]))
}

/// Unwraps the `k8s\0` + `runtime.Unknown` envelope: (apiVersion, kind, raw message).
fn envelope(body: &[u8]) -> Option<(String, String, &[u8])> {
    let rest = body.strip_prefix(b"k8s\0")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (num, f) in fields(rest)? {
        match (num, f) {
            (1, f) => {
                let tm = message(&f)?;
                let m = strings(&tm, &[(1, "apiVersion"), (2, "kind")]);
                api_version = m.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string();
                kind = m.get("kind").and_then(Value::as_str).unwrap_or("").to_string();
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    Some((api_version, kind, raw))
}

/// Decodes a protobuf body of one of the supported kinds into its JSON form.
/// Returns None for anything else (the caller answers 415 then).
pub fn decode(body: &[u8]) -> Option<Value> {
    let (api_version, kind, raw) = envelope(body)?;
    let msg = fields(raw)?;
    let mut obj = json!({"apiVersion": api_version, "kind": kind, "metadata": {}, "spec": {}});
    for (num, f) in &msg {
        match num {
            1 => obj["metadata"] = meta(&message(f)?),
            2 => obj["spec"] = spec(&kind, &message(f)?)?,
            _ => {}
        }
    }
    Some(obj)
}

fn spec(kind: &str, s: &[(u64, Field<'_>)]) -> Option<Value> {
    Some(match kind {
        "SelfSubjectAccessReview" => {
            let mut out = Map::new();
            for (num, f) in s {
                match num {
                    1 => {
                        let ra = message(f)?;
                        let names = [
                            (1, "namespace"),
                            (2, "verb"),
                            (3, "group"),
                            (4, "version"),
                            (5, "resource"),
                            (6, "subresource"),
                            (7, "name"),
                        ];
                        out.insert("resourceAttributes".into(), Value::Object(strings(&ra, &names)));
                    }
                    2 => {
                        let na = message(f)?;
                        out.insert(
                            "nonResourceAttributes".into(),
                            Value::Object(strings(&na, &[(1, "path"), (2, "verb")])),
                        );
                    }
                    _ => {}
                }
            }
            Value::Object(out)
        }
        "SelfSubjectRulesReview" => Value::Object(strings(s, &[(1, "namespace")])),
        // No spec: field 2 is its status, which the server fills in.
        "SelfSubjectReview" => Value::Object(Map::new()),
        "TokenRequest" => {
            let mut out = Map::new();
            let mut audiences = Vec::new();
            for (num, f) in s {
                match (num, f) {
                    (1, f) => audiences.extend(string(f)),
                    (4, Field::Varint(v)) => {
                        out.insert("expirationSeconds".into(), json!(*v as i64));
                    }
                    _ => {}
                }
            }
            out.insert("audiences".into(), json!(audiences));
            Value::Object(out)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(num: u64, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![((num << 3) | 2) as u8, payload.len() as u8];
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn decodes_an_access_review_as_kubectl_sends_it() {
        let ra = [field(1, b"default"), field(2, b"create"), field(3, b"apps"), field(5, b"deployments")].concat();
        let spec = field(1, &ra);
        let raw = [field(1, &[]), field(2, &spec)].concat();
        let tm = [field(1, b"authorization.k8s.io/v1"), field(2, b"SelfSubjectAccessReview")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).expect("decodes");
        assert_eq!(v["kind"], "SelfSubjectAccessReview");
        assert_eq!(
            v["spec"]["resourceAttributes"],
            json!({"namespace": "default", "verb": "create", "group": "apps", "resource": "deployments"})
        );
    }

    #[test]
    fn decodes_a_token_request_and_rejects_garbage() {
        let spec = [field(1, b"aud"), vec![4 << 3, 0x90, 0x1c]].concat(); // expirationSeconds 3600
        let raw = field(2, &spec);
        let tm = [field(1, b"authentication.k8s.io/v1"), field(2, b"TokenRequest")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &tm), field(2, &raw)].concat();
        let v = decode(&body).expect("decodes");
        assert_eq!(v["spec"], json!({"audiences": ["aud"], "expirationSeconds": 3600}));
        assert!(decode(b"k8s\0\xff\xff").is_none());
        assert!(decode(b"{}").is_none());
    }
}
