//! End-to-end tests: real `fleetwatch` processes over real mutual TLS on loopback.

mod admin_web;
mod admission;
mod agent_certs;
mod cli;
mod coalescing;
mod config_policy;
mod delivery;
mod deploy;
mod kube_watch;
mod lifecycle;
mod maintenance;
mod modules;
mod nats;
mod observability;
mod protocol;
mod relay;
mod release;
mod sandbox;
mod sessions;
mod shutdown;
mod soak;
mod startup;
mod storage;
mod support;
mod watchconfig_status;
