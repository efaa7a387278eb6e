//! End-to-end tests: real `fleetwatch` processes over real mutual TLS on loopback.

mod cli;
mod delivery;
mod kube_watch;
mod lifecycle;
mod maintenance;
mod protocol;
mod sandbox;
mod shutdown;
mod soak;
mod support;
