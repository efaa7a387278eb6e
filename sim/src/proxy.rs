//! The API server's service proxy:
//! `/api/v1/namespaces/NS/services/[SCHEME:]NAME[:PORT]/proxy/PATH?QUERY`, forwarded to
//! the endpoint a test registered for that Service port ([`Endpoints`],
//! `SimCluster::expose_service`), as kube-apiserver forwards it to a pod of the Service.
//!
//! What kube-apiserver does and this follows (`pkg/registry/core/service/storage`
//! `ResourceLocation`, `k8s.io/apimachinery/pkg/util/proxy`): the Service must exist
//! (404); a numeric PORT is the Service port with that number, then known by its name
//! (503 `no service port N found for service "NAME"` when none has it); no port means the
//! Service's unnamed port; the port needs an endpoint (503 `no endpoints available for
//! service "ID"`); SCHEME is `http` (default) or `https` (the endpoint's certificate is not
//! verified, as kube-apiserver's proxy transport does not verify it). The request goes on
//! with its method, the path after `/proxy` (`/` when empty), the query and the headers,
//! but never the caller's credentials: `Authorization` (kube-apiserver's authentication
//! filter removes it once it has authenticated the request) and the `Impersonate-*`
//! headers. Hop-by-hop headers are not forwarded either way. An endpoint that cannot be
//! reached is 503 `error trying to reach service: …`.
//!
//! Not as kube-apiserver: the answer is read whole, at most [`MAX_RESPONSE`] bytes (beyond
//! that, 503 naming the limit), within [`TIMEOUT`]; no protocol upgrades (WebSockets) and
//! no rewriting of links in HTML answers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::cluster::Core;
use crate::error::ApiError;
use crate::http::Body;

/// Largest answer of an endpoint passed on.
pub const MAX_RESPONSE: usize = 64 * 1024 * 1024;

/// How long connecting to the endpoint, sending the request and reading the answer may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The registered endpoints: (namespace, Service, port name) → a loopback address. The
/// port name is the Service port's `name` (`""` for a Service's one unnamed port), as an
/// Endpoints object names its ports.
#[derive(Debug, Default)]
pub(crate) struct Endpoints(HashMap<(String, String, String), SocketAddr>);

impl Endpoints {
    /// Registers (or replaces) the endpoint of a Service port. Only loopback addresses:
    /// the sim is not an open proxy into the network it runs in.
    pub fn insert(&mut self, ns: &str, service: &str, port: &str, addr: SocketAddr) -> Result<(), ApiError> {
        if !addr.ip().is_loopback() {
            return Err(ApiError::bad_request(format!(
                "endpoint {addr} of service {ns}/{service} port {port:?}: only loopback addresses can be exposed"
            )));
        }
        self.0.insert((ns.to_string(), service.to_string(), port.to_string()), addr);
        Ok(())
    }

    /// Removes the endpoint of a Service port; whether there was one.
    pub fn remove(&mut self, ns: &str, service: &str, port: &str) -> bool {
        self.0.remove(&(ns.to_string(), service.to_string(), port.to_string())).is_some()
    }

    fn get(&self, ns: &str, service: &str, port: &str) -> Option<SocketAddr> {
        self.0.get(&(ns.to_string(), service.to_string(), port.to_string())).copied()
    }
}

/// `[SCHEME:]NAME[:PORT]` as kube-apiserver splits it (`utilnet.SplitSchemeNamePort`).
fn split_id(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] => (*scheme, *name, *port),
        _ => return None,
    };
    if name.is_empty() || !matches!(scheme, "" | "http" | "https") {
        return None;
    }
    Some((scheme, name, port))
}

fn unavailable(message: String) -> ApiError {
    ApiError { code: 503, reason: "ServiceUnavailable", message, details: None }
}

/// Where the request goes: the endpoint and whether to speak TLS.
fn locate(core: &Core, ns: &str, id: &str) -> Result<(SocketAddr, bool), ApiError> {
    let (scheme, name, port) =
        split_id(id).ok_or_else(|| ApiError::bad_request(format!("invalid service request {id:?}")))?;
    let st = core.lock();
    let def =
        st.registry.get("", "v1", "services").cloned().ok_or_else(|| ApiError::internal("services are not served"))?;
    let svc = crate::ops::get(&st, &def, Some(ns), name)?;
    drop(st);
    let ports: &[Value] = svc["spec"]["ports"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let port_name = |p: &Value| p["name"].as_str().unwrap_or("").to_string();
    let port_name = match port.parse::<i64>() {
        Ok(n) => ports
            .iter()
            .find(|p| p["port"].as_i64() == Some(n))
            .map(port_name)
            .ok_or_else(|| unavailable(format!("no service port {n} found for service {name:?}")))?,
        Err(_) => port.to_string(),
    };
    // The endpoints controller writes one endpoint port per Service port: a name the
    // Service does not declare has none, whatever was registered.
    let declared = ports.iter().any(|p| p["name"].as_str().unwrap_or("") == port_name);
    let addr = core
        .endpoints
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(ns, name, &port_name)
        .filter(|_| declared)
        .ok_or_else(|| unavailable(format!("no endpoints available for service {id:?}")))?;
    Ok((addr, scheme == "https"))
}

/// Headers that belong to one connection (RFC 9110 §7.6.1) and are never forwarded.
fn hop_by_hop(name: &header::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Serves one proxied request; `rest` is what follows `/proxy` in the path.
pub(crate) async fn serve(
    core: Arc<Core>,
    req: Request<Incoming>,
    ns: &str,
    id: &str,
    rest: &str,
) -> Result<Response<Body>, ApiError> {
    let (addr, tls) = locate(&core, ns, id)?;
    let path = if rest.starts_with('/') { rest.to_string() } else { format!("/{rest}") };
    let target = match req.uri().query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let method = req.method().clone();
    let mut headers = req.headers().clone();
    let body = crate::http::read_body(req).await?;
    let forwarded: Vec<header::HeaderName> = headers.keys().cloned().collect();
    for name in forwarded {
        if hop_by_hop(&name)
            || name == header::AUTHORIZATION
            || name == header::HOST
            || name.as_str().starts_with("impersonate-")
        {
            headers.remove(&name);
        }
    }
    let mut upstream = Request::builder()
        .method(method)
        .uri(&target)
        .body(Full::new(body))
        .map_err(|e| ApiError::bad_request(format!("cannot forward {target:?}: {e}")))?;
    *upstream.headers_mut() = headers;
    if let Ok(host) = header::HeaderValue::from_str(&addr.to_string()) {
        upstream.headers_mut().insert(header::HOST, host);
    }
    let answer = tokio::time::timeout(TIMEOUT, forward(addr, tls, upstream))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", TIMEOUT.as_secs())))
        .map_err(|e| unavailable(format!("error trying to reach service: {e}")))?;
    Ok(answer)
}

/// One request on a fresh connection (HTTP/1.1, TLS when asked), the answer read whole.
async fn forward(addr: SocketAddr, tls: bool, req: Request<Full<Bytes>>) -> Result<Response<Body>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("dial tcp {addr}: {e}"))?;
    let resp = if tls {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify))
            .with_no_client_auth();
        let name = rustls_pki_types::ServerName::IpAddress(addr.ip().into());
        let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls handshake with {addr}: {e}"))?;
        send(TokioIo::new(stream), req).await?
    } else {
        send(TokioIo::new(tcp), req).await?
    };
    let (mut parts, body) = resp.into_parts();
    let body = match Limited::new(body, MAX_RESPONSE).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
            return Err(format!("the answer of {addr} is larger than {MAX_RESPONSE} bytes"));
        }
        Err(e) => return Err(format!("reading the answer of {addr}: {e}")),
    };
    let names: Vec<header::HeaderName> = parts.headers.keys().cloned().collect();
    for name in names.iter().filter(|n| hop_by_hop(n) || **n == header::CONTENT_LENGTH) {
        parts.headers.remove(name);
    }
    Ok(Response::from_parts(parts, Full::new(body).boxed()))
}

async fn send<T>(io: TokioIo<T>, req: Request<Full<Bytes>>) -> Result<Response<Incoming>, String>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    // The connection task ends with the request (the sender is dropped after it).
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "proxied connection ended");
        }
    });
    sender.send_request(req).await.map_err(|e| e.to_string())
}

/// kube-apiserver's service proxy does not verify an https endpoint's certificate
/// (`InsecureSkipVerify` in its proxy transport); nor does the sim. Signatures are still
/// checked so the handshake is a real one.
#[derive(Debug)]
struct NoVerify;

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_as_kube_apiserver_splits_them() {
        assert_eq!(split_id("hub"), Some(("", "hub", "")));
        assert_eq!(split_id("hub:admin"), Some(("", "hub", "admin")));
        assert_eq!(split_id("hub:9090"), Some(("", "hub", "9090")));
        assert_eq!(split_id("https:hub:admin"), Some(("https", "hub", "admin")));
        assert_eq!(split_id("http:hub:"), Some(("http", "hub", "")));
        assert_eq!(split_id("ftp:hub:1"), None);
        assert_eq!(split_id(":1"), None);
        assert_eq!(split_id("a:b:c:d"), None);
    }

    #[test]
    fn only_loopback_endpoints_are_registered() {
        let mut e = Endpoints::default();
        assert!(e.insert("ns", "hub", "admin", "127.0.0.1:9090".parse().unwrap()).is_ok());
        assert!(e.insert("ns", "hub", "admin", "10.0.0.1:9090".parse().unwrap()).is_err());
        assert_eq!(e.get("ns", "hub", "admin"), Some("127.0.0.1:9090".parse().unwrap()));
        assert!(e.remove("ns", "hub", "admin"));
        assert_eq!(e.get("ns", "hub", "admin"), None);
    }
}
