//! What every fleetwatch component (hub, lifecycle operator, relays, agent) shares to be
//! observed: one metrics library, [`prometheus_client`], and one small endpoint for
//! `/healthz`, `/readyz` and `/metrics`.
//!
//! - [`exposition`]: a scrape's answer: OpenMetrics by default, the text format 0.0.4 to a
//!   scraper that asks for it (what `promtool check metrics` reads).
//! - [`instruments`](mod@instruments): a component's instruments (kept up to date where
//!   things happen) declared as one table, [`instruments!`], that writes their struct and
//!   registration.
//! - [`collect`]: writing families read at scrape time from a
//!   [`prometheus_client::collector::Collector`] (state that would cost the hot path to keep
//!   current: bus size, liveness, certificate expiry, lag).
//! - [`process`]: what every component serves besides its own families:
//!   `fleetwatch_build_info` and the standard `process_*` metrics (from `/proc/self`).
//! - [`server`]: the health and metrics endpoint of the operator, the relays and the agent;
//!   its handlers also answer those three paths on the hub's admin endpoint.
//!
//! Metric names, types, labels and HELP texts are a contract with `deploy/observability/`
//! (dashboard and alert rules) and docs/operations.md; each component keeps its own.

pub mod collect;
pub mod exposition;
pub mod instruments;
pub mod process;
pub mod server;

pub use server::{Health, Readiness};
