//! The families every component serves besides its own: `fleetwatch_build_info` (which
//! build runs) and the standard `process_*` metrics of the Prometheus client libraries (CPU,
//! memory, file descriptors, start time), read from `/proc/self` at scrape time with the
//! `procfs` crate ([`prometheus_client`] has no process collector). Served by every
//! `/metrics` through [`crate::exposition::encode_component`].
//!
//! On a system without `/proc` (not Linux) only `fleetwatch_build_info` is served; a file
//! of `/proc/self` that cannot be read leaves its families out of that scrape (and says so
//! once in the log) rather than serve a made-up value.

use std::sync::OnceLock;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::registry::Registry;

use crate::collect::gauges;

/// Which build runs, for `fleetwatch_build_info`: set once by the binary at start
/// ([`set_build`]); the crate's version alone until then.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Build {
    /// The release (`0.1.0`).
    pub version: String,
    /// The git commit it was built from (`unknown` when the build did not know).
    pub commit: String,
    /// The compiler that built it (`rustc 1.89.0 (…)`, or `unknown`).
    pub rustc: String,
}

static BUILD: OnceLock<Build> = OnceLock::new();

/// Records which build runs (the first call wins: one binary, one build).
pub fn set_build(build: Build) {
    let _ = BUILD.set(build);
}

/// The build `fleetwatch_build_info` names.
pub fn build() -> Build {
    BUILD.get().cloned().unwrap_or_else(|| Build {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: "unknown".to_string(),
        rustc: "unknown".to_string(),
    })
}

/// The collector of `fleetwatch_build_info` and the `process_*` families.
#[derive(Debug, Default)]
struct Standard;

impl Collector for Standard {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        gauges(
            &mut encoder,
            "fleetwatch_build_info",
            "Which fleetwatch build runs: always 1, the build in its labels",
            [(&build(), 1i64)],
        )?;
        #[cfg(target_os = "linux")]
        linux::encode(&mut encoder)?;
        Ok(())
    }
}

/// The registry of the standard families (no prefix: their names are the conventional ones).
pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut r = Registry::default();
        r.register_collector(Box::new(Standard));
        r
    })
}

#[cfg(target_os = "linux")]
mod linux {
    use std::sync::atomic::{AtomicBool, Ordering};

    use procfs::process::{LimitValue, Process};
    use prometheus_client::encoding::DescriptorEncoder;

    use crate::collect::{counter, gauge};

    /// Logs a `/proc` read that failed, once per process (a scrape every few seconds would
    /// repeat it forever).
    fn unreadable(what: &str, error: &procfs::ProcError) {
        static SAID: AtomicBool = AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::warn!(what, error = %error, "cannot read /proc/self for the process_* metrics; leaving them out");
        }
    }

    /// Bytes or counts as a gauge value: saturating, never wrapping negative.
    fn int(n: u64) -> i64 {
        i64::try_from(n).unwrap_or(i64::MAX)
    }

    pub(super) fn encode(e: &mut DescriptorEncoder) -> std::fmt::Result {
        let me = match Process::myself() {
            Ok(p) => p,
            Err(err) => {
                unreadable("/proc/self", &err);
                return Ok(());
            }
        };
        // /proc/self/stat: one line the kernel writes, a few hundred bytes.
        match me.stat() {
            Ok(stat) => {
                let ticks = procfs::ticks_per_second() as f64;
                counter(
                    e,
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds",
                    (stat.utime + stat.stime) as f64 / ticks,
                )?;
                gauge(
                    e,
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes",
                    int(stat.rss.saturating_mul(procfs::page_size())),
                )?;
                gauge(e, "process_virtual_memory_bytes", "Virtual memory size in bytes", int(stat.vsize))?;
                gauge(e, "process_threads", "Number of OS threads in the process", stat.num_threads)?;
                // The start is in clock ticks after boot; without the boot time it is unknown.
                match procfs::boot_time_secs() {
                    Ok(boot) => gauge(
                        e,
                        "process_start_time_seconds",
                        "Start time of the process since unix epoch in seconds",
                        boot as f64 + stat.starttime as f64 / ticks,
                    )?,
                    Err(err) => unreadable("/proc/stat btime", &err),
                }
            }
            Err(err) => unreadable("/proc/self/stat", &err),
        }
        // One directory entry per open descriptor: bounded by process_max_fds.
        match me.fd_count() {
            Ok(n) => gauge(e, "process_open_fds", "Number of open file descriptors", int(n as u64))?,
            Err(err) => unreadable("/proc/self/fd", &err),
        }
        match me.limits() {
            Ok(limits) => {
                // Unlimited has no number; Prometheus' Go client serves the largest value then.
                let max = match limits.max_open_files.soft_limit {
                    LimitValue::Value(n) => int(n),
                    LimitValue::Unlimited => i64::MAX,
                };
                gauge(e, "process_max_fds", "Maximum number of open file descriptors", max)?;
            }
            Err(err) => unreadable("/proc/self/limits", &err),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }

    #[test]
    fn build_info_and_process_families_are_served_with_sane_values() {
        set_build(Build { version: "9.9.9".into(), commit: "abc".into(), rustc: "rustc 1.0".into() });
        let text = crate::exposition::encode_component(&[]);
        assert!(
            text.lines().any(|l| l == r#"fleetwatch_build_info{version="9.9.9",commit="abc",rustc="rustc 1.0"} 1"#),
            "{text}"
        );
        if cfg!(target_os = "linux") {
            assert!(text.contains("# TYPE process_cpu_seconds counter\n"), "{text}");
            assert!(value(&text, "process_cpu_seconds_total").is_some_and(|v| v >= 0.0), "{text}");
            let rss = value(&text, "process_resident_memory_bytes").unwrap();
            let vsz = value(&text, "process_virtual_memory_bytes").unwrap();
            assert!(rss > 1_000_000.0 && vsz >= rss, "rss {rss}, vsz {vsz}");
            let fds = value(&text, "process_open_fds").unwrap();
            let max = value(&text, "process_max_fds").unwrap();
            assert!(fds >= 3.0 && max >= fds, "fds {fds} of {max}");
            assert!(value(&text, "process_threads").is_some_and(|t| t >= 1.0), "{text}");
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
            let start = value(&text, "process_start_time_seconds").unwrap();
            // This test process started before now, and not a day ago.
            assert!(start <= now + 1.0 && start > now - 86_400.0, "start {start}, now {now}");
        }
        assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1, "{text}");
    }
}
