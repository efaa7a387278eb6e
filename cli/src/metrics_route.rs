//! The `/metrics` route of the lifecycle operator, the relays and the agent: OpenMetrics,
//! or the text format 0.0.4 for a scraper that asks for that instead, as the hub's admin
//! port answers (see `fleetwatch_hub::metrics::exposition`).

use axum::http::header::{ACCEPT, CONTENT_TYPE};

/// A GET route answering with `encode()`'s OpenMetrics exposition, in the format asked for.
pub fn route<F>(encode: F) -> axum::routing::MethodRouter
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    axum::routing::get(move |headers: axum::http::HeaderMap| {
        let body = encode();
        async move {
            let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
            let (content_type, body) = fleetwatch_hub::metrics::exposition(accept, body);
            ([(CONTENT_TYPE, content_type)], body)
        }
    })
}
