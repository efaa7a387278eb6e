//! End-to-end tests: real `fleetwatch` processes over real mutual TLS on loopback.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod access;
mod admin_web;
mod admission;
mod agent_certs;
mod bench_hub;
mod bench_lifecycle;
mod bench_self_service;
mod cli;
mod coalescing;
mod config_policy;
mod delivery;
mod dependencies;
mod deploy;
mod golden;
mod hostile_registry;
mod kube_watch;
mod lifecycle;
mod maintenance;
mod modules;
mod modules_cli;
mod nats;
mod observability;
mod protocol;
mod readme;
mod relay;
mod release;
mod sandbox;
mod self_service;
mod sessions;
mod shutdown;
mod soak;
mod startup;
mod storage;
mod subscriber_certs;
mod support;
mod watchconfig_status;
mod web_scale;
