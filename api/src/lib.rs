//! fleetwatch's Kubernetes API: the custom resources of the control plane (modules, their
//! release metadata, runtimes, maintenance policies, WatchConfigs), the version policy that
//! picks a module's version, and maintenance-window resolution.
//!
//! The lifecycle operator, the hub (WatchConfigs) and the CLI (`crds`, `maintenance`, `up`)
//! share these types without depending on each other.
//!
//! ```
//! use kube::CustomResourceExt;
//! let crd = fleetwatch_api::Runtime::crd();
//! assert_eq!(crd.spec.names.kind, "Runtime");
//! ```

pub mod access_policy;
pub mod chosen;
pub mod config_policy;
pub mod label_selector;
pub mod maintenance;
pub mod module;
pub mod policy;
pub mod summary;
pub mod watchconfig;

pub use module::*;
