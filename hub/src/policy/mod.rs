//! Who may do what, and what is refused: the subscriber access policy ([`access`], from
//! its file and from the control plane's SubscriberAccessPolicy objects, [`objects`]), the
//! deny list of certificates ([`revocation`]), and the start-up checks that refuse a
//! configuration that cannot work ([`preflight`]). Each fails closed: a file that breaks
//! keeps the last good one in force, and nothing falls back to allowing everyone.

pub(crate) mod access;
pub(crate) mod objects;
pub(crate) mod preflight;
pub(crate) mod revocation;
