//! `fleetwatch maintenance next` with a lifecycle-manager-format policy file.

use std::process::Command;

use crate::support::BIN;

/// lifecycle-manager's `internal/maintenancewindows/testdata/policy.json`, plus an overnight
/// rule and an absolute-window rule.
const POLICY: &str = r#"{
  "rules": [
    {"match": {"plan": "trial|free"},
     "windows": [{"days": ["Mon","Tue","Wed","Thu","Fri","Sat","Sun"], "begin": "01:00:00+00:00", "end": "01:00:00+00:00"}]},
    {"match": {"region": "europe|eu-|uksouth"},
     "windows": [{"days": ["Sat"], "begin": "21:00:00+00:00", "end": "00:00:00+00:00"}]},
    {"match": {"platformRegion": "cf-us", "globalAccountId": "^ga-overnight$"},
     "windows": [{"days": ["Fri"], "begin": "22:00:00-05:00", "end": "02:00:00-05:00"}]},
    {"match": {"region": "asia|ap-"},
     "windows": [{"begin": "2024-10-15T13:00:00Z", "end": "2024-10-15T17:00:00Z"}]}
  ],
  "default": {"days": ["Sat"], "begin": "21:00:00+00:00", "end": "23:00:00+00:00"}
}"#;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).env("FLEETWATCH_LOG", "warn").output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn policy_file(dir: &tempfile::TempDir, name: &str, json: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, json).unwrap();
    path.to_str().unwrap().to_string()
}

/// Runs `maintenance next` and returns the (begin, end) it prints.
fn next(policy: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["maintenance", "next", "--policy", policy];
    args.extend_from_slice(extra);
    let (code, out, err) = run(&args);
    assert_eq!(code, 0, "{args:?}: {err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{out:?}: {e}"));
    assert_eq!(v.as_object().unwrap().len(), 2, "{out}");
    (v["begin"].as_str().unwrap().to_string(), v["end"].as_str().unwrap().to_string())
}

fn pair(begin: &str, end: &str) -> (String, String) {
    (begin.to_string(), end.to_string())
}

#[test]
fn maintenance_next_resolves_lifecycle_manager_policies() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_file(&dir, "policy.json", POLICY);
    let wed = "2024-10-09T12:00:00Z";

    assert_eq!(next(&p, &["--label", "plan=trial", "--at", wed]), pair("2024-10-10T01:00:00Z", "2024-10-11T01:00:00Z"));
    assert_eq!(
        next(&p, &["--label", "plan=aws", "--label", "region=westeurope", "--at", wed]),
        pair("2024-10-12T21:00:00Z", "2024-10-13T00:00:00Z")
    );
    // Overnight, in -05:00: Friday 22:00 to Saturday 02:00 there.
    let overnight = ["--label", "globalAccountID=ga-overnight", "--label", "platformRegion=cf-us10"];
    assert_eq!(
        next(&p, &[&overnight[..], &["--at", wed]].concat()),
        pair("2024-10-12T03:00:00Z", "2024-10-12T07:00:00Z")
    );
    // Absolute window.
    assert_eq!(
        next(&p, &["--label", "region=ap-southeast-1", "--at", wed]),
        pair("2024-10-15T13:00:00Z", "2024-10-15T17:00:00Z")
    );
    // No rule matches (and no labels at all): the default.
    assert_eq!(
        next(&p, &["--label", "region=us-east-1", "--at", wed]),
        pair("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z")
    );
    assert_eq!(next(&p, &["--at", wed]), pair("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z"));
    // Without --at: a window in the future.
    let (begin, _) = next(&p, &["--label", "plan=free"]);
    assert!(begin.parse::<jiff::Timestamp>().unwrap() > jiff::Timestamp::now());
}

#[test]
fn maintenance_next_ongoing() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_file(&dir, "policy.json", POLICY);
    let eu = ["--label", "region=eu-central-1"];
    let inside = "2024-10-12T23:00:00Z"; // an hour before the Saturday window closes

    // Without --ongoing: the next one.
    assert_eq!(next(&p, &[&eu[..], &["--at", inside]].concat()), pair("2024-10-19T21:00:00Z", "2024-10-20T00:00:00Z"));
    // With it: the current one, the default minimum (20m) remaining.
    let current = pair("2024-10-12T21:00:00Z", "2024-10-13T00:00:00Z");
    assert_eq!(next(&p, &[&eu[..], &["--at", inside, "--ongoing"]].concat()), current);
    assert_eq!(next(&p, &[&eu[..], &["--at", inside, "--ongoing", "--min-remaining", "59m"]].concat()), current);
    // Not enough of it left: the next one.
    assert_eq!(
        next(&p, &[&eu[..], &["--at", inside, "--ongoing", "--min-remaining", "1h30m"]].concat()),
        pair("2024-10-19T21:00:00Z", "2024-10-20T00:00:00Z")
    );
    // Overnight: Saturday 05:00Z is inside the window that began Friday 22:00 -05:00.
    let overnight = ["--label", "globalAccountID=ga-overnight", "--label", "platformRegion=cf-us10"];
    assert_eq!(
        next(&p, &[&overnight[..], &["--at", "2024-10-12T05:00:00Z", "--ongoing"]].concat()),
        pair("2024-10-12T03:00:00Z", "2024-10-12T07:00:00Z")
    );
}

#[test]
fn maintenance_next_errors_are_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let expect_error = |args: &[&str], needle: &str| {
        let (code, out, err) = run(args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(out.is_empty(), "{out}");
        let line = err.trim_end();
        assert!(!line.contains('\n'), "{err}");
        assert!(line.starts_with("error: "), "{err}");
        assert!(line.contains(needle), "{needle:?} not in {err}");
    };
    let bad_regex = policy_file(&dir, "regex.json", r#"{"rules": [{"match": {"plan": "trial|(free"}}]}"#);
    expect_error(&["maintenance", "next", "--policy", &bad_regex], r#"invalid maintenance policy"#);
    expect_error(
        &["maintenance", "next", "--policy", &bad_regex],
        r#"invalid regular expression "trial|(free" in rules[0].match.plan"#,
    );
    let bad_time =
        policy_file(&dir, "time.json", r#"{"default": {"days": ["Sat"], "begin": "21:00", "end": "23:00:00Z"}}"#);
    expect_error(&["maintenance", "next", "--policy", &bad_time], r#"invalid time "21:00" in default.begin"#);
    let bad_day = policy_file(
        &dir,
        "day.json",
        r#"{"default": {"days": ["Saturday"], "begin": "21:00:00Z", "end": "23:00:00Z"}}"#,
    );
    expect_error(&["maintenance", "next", "--policy", &bad_day], r#"unknown day "Saturday" in default.days"#);
    let not_json = policy_file(&dir, "x.json", "rules: []");
    expect_error(&["maintenance", "next", "--policy", &not_json], "invalid maintenance policy JSON");
    expect_error(
        &["maintenance", "next", "--policy", "/nonexistent/policy.json"],
        "cannot read /nonexistent/policy.json",
    );

    // A valid policy with no window for the runtime.
    let past = policy_file(
        &dir,
        "past.json",
        r#"{"rules": [{"match": {"plan": "trial"}, "windows": [{"begin": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z"}]}]}"#,
    );
    expect_error(
        &["maintenance", "next", "--policy", &past, "--label", "plan=trial"],
        "no maintenance window found: rules[0] matches but has no upcoming window, and the policy has no default window",
    );
    expect_error(&["maintenance", "next", "--policy", &past], "no rule matches the runtime");

    // Bad arguments.
    let ok = policy_file(&dir, "ok.json", POLICY);
    let (code, _, err) = run(&["maintenance", "next", "--policy", &ok, "--label", "zone=a"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown runtime label \"zone\""), "{err}");
    let (code, _, err) = run(&["maintenance", "next", "--policy", &ok, "--ongoing", "--min-remaining", "soon"]);
    assert_ne!(code, 0);
    assert!(err.contains("--min-remaining"), "{err}");
    let (code, _, err) = run(&["maintenance", "next", "--policy", &ok, "--at", "yesterday"]);
    assert_ne!(code, 0);
    assert!(err.contains("--at"), "{err}");
}

#[test]
fn a_window_without_days_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let p = policy_file(&dir, "nodays.json", r#"{"default": {"begin": "01:00:00Z", "end": "02:00:00Z"}}"#);
    let (code, _, err) = run(&["maintenance", "next", "--policy", &p, "--at", "2024-10-09T12:00:00Z"]);
    assert_ne!(code, 0);
    assert!(err.contains("times of day") && err.contains("no days") && err.contains("list its days"), "{err}");
}
