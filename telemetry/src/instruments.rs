//! A component's instruments (the metrics kept up to date where things happen) declared as
//! one table: [`instruments!`](crate::instruments!) writes the struct that holds them and
//! their registration from it, so adding a metric is one entry (its doc, field, start
//! value, name and HELP text together) and the exposition order is the table's.
//!
//! The names, HELP texts and types are a contract with `deploy/observability/` and
//! docs/operations.md (see the [crate docs](crate)); the table keeps each component's own.

#[doc(hidden)]
pub use prometheus_client::registry::Registry;

/// Declares a component's metrics struct as a table. Each field is either an instrument,
/// `field: Type = start value => "name", "HELP text";`, registered under that name in the
/// order of the table, or anything else the struct holds, `field: Type = value;`, not
/// registered. It writes the struct (its attributes, docs and visibilities as given) and two
/// associated functions: `unregistered()`, every field at its start value, and
/// `register(&self, registry)`, registering a clone of each instrument (they share their
/// values with the originals). What is not a plain instrument (label sets served from the
/// start, collectors read at scrape time) the component adds by hand after `register`.
///
/// ```
/// use prometheus_client::metrics::counter::Counter;
/// use prometheus_client::metrics::gauge::Gauge;
/// use prometheus_client::registry::Registry;
///
/// fleetwatch_telemetry::instruments! {
///     /// The metrics of a small component.
///     pub struct Metrics {
///         /// Requests served.
///         pub requests: Counter = Counter::default() => "requests", "Requests served";
///         /// Connections open now.
///         pub open: Gauge = Gauge::default() => "connections_open", "Connections open";
///         /// Not a metric: where they are registered.
///         registry: Registry = Registry::default();
///     }
/// }
///
/// let m = Metrics::unregistered();
/// let mut registry = Registry::with_prefix("small");
/// m.register(&mut registry);
/// m.requests.inc();
/// let text = fleetwatch_telemetry::exposition::encode(&[&registry]);
/// assert!(text.starts_with("# HELP small_requests Requests served.\n# TYPE small_requests counter\n"));
/// assert!(text.contains("small_requests_total 1\n"));
/// assert!(text.contains("# TYPE small_connections_open gauge\nsmall_connections_open 0\n"));
/// ```
#[macro_export]
macro_rules! instruments {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident: $ty:ty = $start:expr $(=> $metric:literal, $help:literal)?;
            )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                $(#[$field_meta])*
                $field_vis $field: $ty,
            )*
        }

        impl $name {
            /// Every field at its start value; no instrument registered yet.
            fn unregistered() -> Self {
                Self { $($field: $start,)* }
            }

            /// Registers each instrument of the table in `registry`, in the table's order
            /// (the exposition's).
            fn register(&self, registry: &mut $crate::instruments::Registry) {
                $($(registry.register($metric, $help, self.$field.clone());)?)*
            }
        }
    };
}
