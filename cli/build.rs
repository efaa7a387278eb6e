//! Records the git commit the binary is built from in `FLEETWATCH_GIT_COMMIT`, for
//! `fleetwatch version`: the variable of that name when set at build time (an image built
//! from a tarball passes it in), else `git rev-parse` when the sources are a git checkout,
//! else `unknown` (a tarball without .git); and the compiler's `rustc --version` in
//! `FLEETWATCH_RUSTC`, for `fleetwatch_build_info`. Never fails the build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=FLEETWATCH_GIT_COMMIT");
    let commit = match std::env::var("FLEETWATCH_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => {
            let commit = git(&["rev-parse", "--short=12", "HEAD"]);
            if commit.is_some() {
                // Rebuild when HEAD moves (a commit, a checkout), but only watch files that
                // exist: a missing path would rerun this script on every build.
                for path in ["HEAD", "packed-refs"] {
                    if let Some(p) = git(&["rev-parse", "--git-path", path])
                        && std::path::Path::new(&p).exists()
                    {
                        println!("cargo:rerun-if-changed={p}");
                    }
                }
                if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"])
                    && let Some(p) = git(&["rev-parse", "--git-path", &r])
                    && std::path::Path::new(&p).exists()
                {
                    println!("cargo:rerun-if-changed={p}");
                }
            }
            commit.unwrap_or_else(|| "unknown".into())
        }
    };
    println!("cargo:rustc-env=FLEETWATCH_GIT_COMMIT={commit}");
    // The compiler cargo builds with (RUSTC), not whichever `rustc` is first on PATH.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=FLEETWATCH_RUSTC={version}");
}
