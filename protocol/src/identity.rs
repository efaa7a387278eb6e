//! Identities carried in certificates as SPIFFE URI SANs.
//!
//! The hub takes a peer's identity from its certificate only, never from a frame:
//! `spiffe://<trust-domain>/cluster/<id>` for an agent,
//! `spiffe://<trust-domain>/subscriber/<name>` for a subscriber and
//! `spiffe://<trust-domain>/hub` for the hub itself.

use std::fmt;
use std::str::FromStr;

/// The longest cluster id or subscriber name we accept.
pub const MAX_NAME_LEN: usize = 128;

/// The default trust domain used by `fleetwatch certs init`.
pub const DEFAULT_TRUST_DOMAIN: &str = "fleetwatch.local";

/// What a certificate says its holder is.
///
/// ```
/// use fleetwatch_protocol::identity::{Identity, Role};
/// let id: Identity = "spiffe://example.org/cluster/eu-1".parse().unwrap();
/// assert_eq!(id.role, Role::Cluster("eu-1".into()));
/// assert_eq!(id.to_string(), "spiffe://example.org/cluster/eu-1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// The SPIFFE trust domain, e.g. `fleetwatch.local`.
    pub trust_domain: String,
    /// The role and name within the trust domain.
    pub role: Role,
}

/// The role an identity plays.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Role {
    /// An agent publishing for one runtime cluster.
    Cluster(String),
    /// A subscriber (an operator, `fleetwatch tail`).
    Subscriber(String),
    /// The hub.
    Hub,
    /// The certificate authority of the trust domain (`spiffe://<td>`).
    TrustDomain,
}

/// Why a string is not an identity we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Not a `spiffe://` URI.
    #[error("not a SPIFFE id (expected spiffe://<trust-domain>/...): {0:?}")]
    NotSpiffe(String),
    /// The trust domain is empty or has characters SPIFFE forbids.
    #[error("invalid trust domain {0:?}: use lower-case letters, digits, '.', '-' and '_'")]
    TrustDomain(String),
    /// The path names no role fleetwatch knows.
    #[error("unknown identity path {0:?}: expected /cluster/<id>, /subscriber/<name> or /hub")]
    UnknownPath(String),
    /// The cluster id or subscriber name is empty, too long or has bad characters.
    #[error("invalid name {0:?}: 1 to {MAX_NAME_LEN} characters of letters, digits, '.', '-' and '_'")]
    Name(String),
}

impl Identity {
    /// An agent identity for cluster `id`.
    pub fn cluster(trust_domain: &str, id: &str) -> Result<Self, IdentityError> {
        validate_trust_domain(trust_domain)?;
        validate_name(id)?;
        Ok(Self { trust_domain: trust_domain.into(), role: Role::Cluster(id.into()) })
    }

    /// A subscriber identity called `name`.
    pub fn subscriber(trust_domain: &str, name: &str) -> Result<Self, IdentityError> {
        validate_trust_domain(trust_domain)?;
        validate_name(name)?;
        Ok(Self { trust_domain: trust_domain.into(), role: Role::Subscriber(name.into()) })
    }

    /// The hub identity.
    pub fn hub(trust_domain: &str) -> Result<Self, IdentityError> {
        validate_trust_domain(trust_domain)?;
        Ok(Self { trust_domain: trust_domain.into(), role: Role::Hub })
    }

    /// The identity of the trust domain itself, carried by the CA certificate.
    pub fn trust_domain(trust_domain: &str) -> Result<Self, IdentityError> {
        validate_trust_domain(trust_domain)?;
        Ok(Self { trust_domain: trust_domain.into(), role: Role::TrustDomain })
    }

    /// The cluster id, if this is an agent identity.
    pub fn cluster_id(&self) -> Option<&str> {
        match &self.role {
            Role::Cluster(id) => Some(id),
            _ => None,
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.role {
            Role::Cluster(id) => write!(f, "spiffe://{}/cluster/{id}", self.trust_domain),
            Role::Subscriber(n) => write!(f, "spiffe://{}/subscriber/{n}", self.trust_domain),
            Role::Hub => write!(f, "spiffe://{}/hub", self.trust_domain),
            Role::TrustDomain => write!(f, "spiffe://{}", self.trust_domain),
        }
    }
}

impl FromStr for Identity {
    type Err = IdentityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s.strip_prefix("spiffe://").ok_or_else(|| IdentityError::NotSpiffe(s.into()))?;
        let (td, path) = match rest.split_once('/') {
            Some((td, path)) => (td, path),
            None => (rest, ""),
        };
        validate_trust_domain(td)?;
        let role = match path.split('/').collect::<Vec<_>>().as_slice() {
            [""] => Role::TrustDomain,
            ["hub"] => Role::Hub,
            ["cluster", id] => {
                validate_name(id)?;
                Role::Cluster((*id).into())
            }
            ["subscriber", name] => {
                validate_name(name)?;
                Role::Subscriber((*name).into())
            }
            _ => return Err(IdentityError::UnknownPath(format!("/{path}"))),
        };
        Ok(Self { trust_domain: td.into(), role })
    }
}

/// Checks a SPIFFE trust domain name.
pub fn validate_trust_domain(td: &str) -> Result<(), IdentityError> {
    let ok = !td.is_empty()
        && td.len() <= 255
        && td.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
    if ok { Ok(()) } else { Err(IdentityError::TrustDomain(td.into())) }
}

/// Checks a cluster id or subscriber name.
pub fn validate_name(name: &str) -> Result<(), IdentityError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        && name != "."
        && name != "..";
    if ok { Ok(()) } else { Err(IdentityError::Name(name.into())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_role() {
        for s in ["spiffe://td/cluster/c-1", "spiffe://td/subscriber/lifecycle", "spiffe://td/hub", "spiffe://td"] {
            let id: Identity = s.parse().unwrap();
            assert_eq!(id.to_string(), s);
        }
    }

    #[test]
    fn rejects_bad_identities() {
        assert!(matches!("https://td/cluster/a".parse::<Identity>(), Err(IdentityError::NotSpiffe(_))));
        assert!(matches!("spiffe://TD/cluster/a".parse::<Identity>(), Err(IdentityError::TrustDomain(_))));
        assert!(matches!("spiffe://td/admin/a".parse::<Identity>(), Err(IdentityError::UnknownPath(_))));
        assert!(matches!("spiffe://td/cluster/a/b".parse::<Identity>(), Err(IdentityError::UnknownPath(_))));
        assert!(matches!("spiffe://td/cluster/".parse::<Identity>(), Err(IdentityError::Name(_))));
        assert!(matches!("spiffe://td/cluster/a%2f".parse::<Identity>(), Err(IdentityError::Name(_))));
        assert!(Identity::cluster("td", &"x".repeat(MAX_NAME_LEN + 1)).is_err());
    }
}
