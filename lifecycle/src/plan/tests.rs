//! Table-driven tests of the module rules: channels and the mandatory floor, downgrade
//! protection on the running version, dependencies (`requires`), paced rollouts,
//! maintenance windows, backoff holding a failed module, deletion strategies, create-once
//! default configuration and when to look again.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::maintenance::{MaintenancePolicy, MaintenancePolicySpec, WindowSpec};
use fleetwatch_api::policy::Step;
use fleetwatch_api::{
    ChannelVersion, CustomResourcePolicy, FailedStep, ModuleEntry, ModuleReleaseMeta, ModuleReleaseMetaSpec,
    ModuleRequirement, ModuleRetry, ModuleStatus, ModuleTemplate, ModuleTemplateSpec, RolloutPolicy, Runtime,
    RuntimeSpec, State,
};

use super::*;

const NS: &str = "kcp";

fn v(s: &str) -> semver::Version {
    semver::Version::parse(s).unwrap()
}

fn now() -> jiff::Timestamp {
    "2026-11-27T12:00:00Z".parse().unwrap()
}

fn entry(name: &str) -> ModuleEntry {
    ModuleEntry { name: name.into(), ..Default::default() }
}

fn runtime(spec: RuntimeSpec) -> Runtime {
    let mut rt = Runtime::new("rt", spec);
    rt.metadata.namespace = Some(NS.into());
    rt
}

fn runtime_with(modules: &[&str]) -> Runtime {
    runtime(RuntimeSpec { modules: modules.iter().map(|m| entry(m)).collect(), ..Default::default() })
}

fn meta_in(ns: &str, module: &str, channels: &[(&str, &str)], mandatory: Option<&str>) -> Arc<ModuleReleaseMeta> {
    let mut m = ModuleReleaseMeta::new(
        module,
        ModuleReleaseMetaSpec {
            module_name: module.into(),
            channels: channels
                .iter()
                .map(|(c, v)| ChannelVersion { channel: c.to_string(), version: v.to_string() })
                .collect(),
            mandatory: mandatory.map(str::to_string),
            ..Default::default()
        },
    );
    m.metadata.namespace = Some(ns.into());
    Arc::new(m)
}

fn meta(module: &str, channels: &[(&str, &str)]) -> Arc<ModuleReleaseMeta> {
    meta_in(NS, module, channels, None)
}

fn paced(module: &str, channels: &[(&str, &str)]) -> Arc<ModuleReleaseMeta> {
    let mut m = (*meta(module, channels)).clone();
    m.spec.rollout = Some(RolloutPolicy { max_in_flight: 1, step_percent: 50, max_failure_ratio: 0.5 });
    Arc::new(m)
}

fn tpl(module: &str, version: &str, requires: &[&str], downtime: bool) -> Arc<ModuleTemplate> {
    let mut t = ModuleTemplate::new(
        &format!("{module}-{version}"),
        ModuleTemplateSpec {
            module_name: module.into(),
            version: version.into(),
            requires_downtime: downtime,
            requires: requires.iter().map(|m| ModuleRequirement { module: m.to_string(), versions: None }).collect(),
            ..Default::default()
        },
    );
    t.metadata.namespace = Some(NS.into());
    Arc::new(t)
}

fn window(begin: &str, end: &str) -> WindowSpec {
    WindowSpec { days: Vec::new(), begin: Some(begin.into()), end: Some(end.into()) }
}

fn policy(name: &str, w: WindowSpec) -> Arc<MaintenancePolicy> {
    let mut p = MaintenancePolicy::new(name, MaintenancePolicySpec { rules: Vec::new(), default: Some(w) });
    p.metadata.namespace = Some(NS.into());
    Arc::new(p)
}

fn status(name: &str, state: State, version: Option<&str>) -> ModuleStatus {
    ModuleStatus {
        name: name.into(),
        state,
        installed_version: version.map(str::to_string),
        actual_version: version.map(str::to_string),
        ..Default::default()
    }
}

#[test]
fn the_desired_version_follows_pin_then_module_channel_then_runtime_channel_then_regular() {
    let metas = [
        meta("m", &[("regular", "1.0.0"), ("fast", "2.0.0"), ("rapid", "3.0.0")]),
        // The same module in another namespace never counts.
        meta_in("other", "m", &[("regular", "9.0.0")], None),
        meta_in(NS, "floored", &[("regular", "1.0.0"), ("fast", "3.0.0")], Some("2.0.0")),
    ];
    let stores = Stores { ns: NS, templates: &[], metas: &metas, policies: &[] };
    struct Case {
        module: &'static str,
        pinned: Option<&'static str>,
        module_channel: Option<&'static str>,
        runtime_channel: Option<&'static str>,
        want: Result<(&'static str, Option<&'static str>), &'static str>,
    }
    let cases = [
        Case {
            module: "m",
            pinned: None,
            module_channel: None,
            runtime_channel: None,
            want: Ok(("1.0.0", Some("regular"))),
        },
        Case {
            module: "m",
            pinned: None,
            module_channel: None,
            runtime_channel: Some("fast"),
            want: Ok(("2.0.0", Some("fast"))),
        },
        Case {
            module: "m",
            pinned: None,
            module_channel: Some("rapid"),
            runtime_channel: Some("fast"),
            want: Ok(("3.0.0", Some("rapid"))),
        },
        Case {
            module: "m",
            pinned: Some("v0.5.0"),
            module_channel: Some("rapid"),
            runtime_channel: None,
            want: Ok(("0.5.0", None)),
        },
        // The mandatory version is a floor for every channel.
        Case {
            module: "floored",
            pinned: None,
            module_channel: None,
            runtime_channel: None,
            want: Ok(("2.0.0", Some("regular"))),
        },
        Case {
            module: "floored",
            pinned: None,
            module_channel: Some("fast"),
            runtime_channel: None,
            want: Ok(("3.0.0", Some("fast"))),
        },
        Case {
            module: "m",
            pinned: None,
            module_channel: Some("nightly"),
            runtime_channel: None,
            want: Err("nightly"),
        },
        Case { module: "ghost", pinned: None, module_channel: None, runtime_channel: None, want: Err("ghost") },
        Case {
            module: "m",
            pinned: Some("not-a-version"),
            module_channel: None,
            runtime_channel: None,
            want: Err("not-a-version"),
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let e = ModuleEntry {
            version: c.pinned.map(str::to_string),
            channel: c.module_channel.map(str::to_string),
            ..entry(c.module)
        };
        let rt = runtime(RuntimeSpec { channel: c.runtime_channel.map(str::to_string), ..Default::default() });
        let got = desired(&e, &rt, &stores);
        match (&c.want, got) {
            (Ok((version, channel)), Ok((got_v, got_c))) => {
                assert_eq!((got_v.to_string().as_str(), got_c.as_deref()), (*version, *channel), "case {i}")
            }
            (Err(names), Err(why)) => assert!(why.contains(names), "case {i}: {why}"),
            (want, got) => panic!("case {i}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn templates_are_found_by_module_version_and_namespace() {
    let mut elsewhere = (*tpl("m", "1.0.0", &[], false)).clone();
    elsewhere.metadata.namespace = Some("other".into());
    let templates = [Arc::new(elsewhere), tpl("m", "v2.0.0", &[], false)];
    let stores = Stores { ns: NS, templates: &templates, metas: &[], policies: &[] };
    assert!(stores.template("m", &v("1.0.0")).is_none(), "another namespace's template");
    assert_eq!(stores.template("m", &v("2.0.0")).map(|t| t.spec.version.clone()).as_deref(), Some("v2.0.0"));
    assert!(stores.template("n", &v("2.0.0")).is_none());
}

/// The decision for module `app` wanting 2.0.0 (template `t`), with `running` running.
fn decide_app(
    rt: &Runtime,
    stores: Stores<'_>,
    t: &ModuleTemplate,
    e: &ModuleEntry,
    running: Option<&str>,
    known: &[ModuleStatus],
) -> Decision {
    let listed: Vec<String> = rt.spec.modules.iter().map(|e| e.name.clone()).collect();
    let inputs = Inputs {
        rt,
        stores,
        known,
        listed: &listed,
        now: now(),
        min_window_remaining: jiff::SignedDuration::from_mins(20),
    };
    decide(&inputs, e, &v("2.0.0"), t, running.map(v).as_ref())
}

fn change(step: Step, migrate: bool) -> Decision {
    Decision::Change(Change { step, rollout: None, window: Window::Open, migrate })
}

#[test]
fn downgrades_of_the_running_version_are_refused_and_the_rest_installs_upgrades_or_keeps() {
    let rt = runtime_with(&["app"]);
    let t = tpl("app", "2.0.0", &[], false);
    let stores = Stores { ns: NS, templates: &[], metas: &[], policies: &[] };
    let cases = [
        (None, change(Step::Install, true)),
        (Some("1.0.0"), change(Step::Upgrade { from: v("1.0.0") }, true)),
        // Rule 6: no migration when keeping a version.
        (Some("2.0.0"), change(Step::Keep, false)),
        // Rule 2: on the version running, whoever installed it.
        (Some("3.0.0"), Decision::RefuseDowngrade("downgrade from 3.0.0 to 2.0.0 not applied".into())),
    ];
    for (running, want) in cases {
        assert_eq!(decide_app(&rt, stores, &t, &entry("app"), running, &[]), want, "running {running:?}");
    }
}

/// What is checked, the Runtime, the version running, the modules known, the decision.
type DependencyCase<'a> = (&'a str, &'a Runtime, Option<&'a str>, Vec<ModuleStatus>, Decision);

#[test]
fn an_install_or_upgrade_waits_for_what_its_version_requires() {
    let templates = [tpl("app", "2.0.0", &["istio"], false), tpl("istio", "1.0.0", &[], false)];
    let metas = [meta("istio", &[("regular", "1.0.0")])];
    let stores = Stores { ns: NS, templates: &templates, metas: &metas, policies: &[] };
    let listed = runtime_with(&["istio", "app"]);
    let alone = runtime_with(&["app"]);
    let waiting =
        |state, why: &str| Decision::WaitForDependency(state, format!("app 2.0.0 waits for module istio{why}"));
    let cases: [DependencyCase<'_>; 6] = [
        (
            "not listed: someone must add it",
            &alone,
            None,
            vec![],
            waiting(State::Warning, ": it is not in this Runtime's modules (add it to spec.modules)"),
        ),
        (
            "listed, not installed yet",
            &listed,
            None,
            vec![],
            waiting(State::Processing, " to be installed and Ready (not installed yet)"),
        ),
        (
            "listed, on its way",
            &listed,
            Some("1.0.0"),
            vec![status("istio", State::Processing, Some("1.0.0"))],
            waiting(State::Processing, " to be installed and Ready (it is Processing)"),
        ),
        (
            "Ready: the install goes ahead",
            &listed,
            None,
            vec![status("istio", State::Ready, Some("1.0.0"))],
            change(Step::Install, true),
        ),
        (
            "unmanaged with a running version counts",
            &listed,
            Some("1.0.0"),
            vec![status("istio", State::Unmanaged, Some("1.0.0"))],
            change(Step::Upgrade { from: v("1.0.0") }, true),
        ),
        // Keeping what runs never waits.
        ("keep", &alone, Some("2.0.0"), vec![], change(Step::Keep, false)),
    ];
    for (what, rt, running, known, want) in cases {
        assert_eq!(decide_app(rt, stores, &templates[0], &entry("app"), running, &known), want, "{what}");
    }
}

#[test]
fn a_template_whose_requirements_cannot_be_met_is_unusable() {
    // A cycle: app requires istio, istio requires app.
    let cyclic = [tpl("app", "2.0.0", &["istio"], false), tpl("istio", "1.0.0", &["app"], false)];
    let metas = [meta("istio", &[("regular", "1.0.0")]), meta("app", &[("regular", "2.0.0")])];
    let stores = Stores { ns: NS, templates: &cyclic, metas: &metas, policies: &[] };
    let rt = runtime_with(&["istio", "app"]);
    let Decision::Unusable(why) = decide_app(&rt, stores, &cyclic[0], &entry("app"), None, &[]) else {
        panic!("a cycle is unusable")
    };
    assert!(why.starts_with("ModuleTemplate app-2.0.0 is not usable: spec.requires: a cycle"), "{why}");
    // No release meta of the required module: nothing can satisfy it.
    let stores = Stores { ns: NS, templates: &cyclic[..1], metas: &[], policies: &[] };
    assert!(matches!(decide_app(&rt, stores, &cyclic[0], &entry("app"), None, &[]), Decision::Unusable(_)));
}

#[test]
fn only_an_upgrade_a_channel_move_caused_waits_for_a_paced_rollout() {
    let t = tpl("app", "2.0.0", &[], false);
    let metas = [paced("app", &[("regular", "2.0.0")])];
    let stores = Stores { ns: NS, templates: &[], metas: &metas, policies: &[] };
    let rt = runtime_with(&["app"]);
    let pinned = ModuleEntry { version: Some("2.0.0".into()), ..entry("app") };
    let rollout_of = |d: Decision| match d {
        Decision::Change(c) => c.rollout.is_some(),
        other => panic!("{other:?}"),
    };
    let cases = [
        ("channel upgrade", entry("app"), Some("1.0.0"), true),
        ("pinned upgrade", pinned, Some("1.0.0"), false),
        ("install", entry("app"), None, false),
        ("keep", entry("app"), Some("2.0.0"), false),
    ];
    for (what, e, running, paced) in cases {
        assert_eq!(rollout_of(decide_app(&rt, stores, &t, &e, running, &[])), paced, "{what}");
    }
    // Without a rollout policy, all at once.
    let metas = [meta("app", &[("regular", "2.0.0")])];
    let stores = Stores { ns: NS, templates: &[], metas: &metas, policies: &[] };
    assert!(!rollout_of(decide_app(&rt, stores, &t, &entry("app"), Some("1.0.0"), &[])));
}

/// What is checked, the Runtime, the policies, the version running, the window decided.
type WindowCase<'a> = (&'a str, Runtime, &'a [Arc<MaintenancePolicy>], Option<&'a str>, Window);
/// What is checked, the Runtime, the policies, what the message says, when to look again.
type HeldCase<'a> = (&'a str, Runtime, &'a [Arc<MaintenancePolicy>], &'a str, Option<Duration>);

#[test]
fn a_downtime_upgrade_waits_for_a_maintenance_window_or_is_held() {
    let downtime = tpl("app", "2.0.0", &[], true);
    let inside = window("2026-11-27T11:00:00Z", "2026-11-27T14:00:00Z");
    let later = window("2026-11-27T13:00:00Z", "2026-11-27T15:00:00Z");
    // Less than the 20 minutes a downtime upgrade needs are left.
    let ending = window("2026-11-27T11:00:00Z", "2026-11-27T12:10:00Z");
    let past = window("2026-11-26T11:00:00Z", "2026-11-26T14:00:00Z");
    let default_later = [policy("default", later.clone())];
    let named_inside = [policy("weekly", inside.clone())];
    let broken = [policy("default", window("whenever", "later"))];
    let spec = |f: fn(&mut RuntimeSpec)| {
        let mut s = RuntimeSpec { modules: vec![entry("app")], ..Default::default() };
        f(&mut s);
        runtime(s)
    };
    let own = |w: &WindowSpec| runtime(RuntimeSpec { maintenance_windows: vec![w.clone()], ..Default::default() });
    let upgrade = Some("1.0.0");
    let held = |message: &str, look_again| Window::Hold {
        from: v("1.0.0"),
        message: format!("upgrade to 2.0.0 {message}"),
        look_again,
    };
    let cases: Vec<WindowCase<'_>> = vec![
        ("windows skipped", spec(|s| s.skip_maintenance_windows = true), &[], upgrade, Window::Open),
        ("inside the runtime's own window", own(&inside), &[], upgrade, Window::Open),
        ("an install needs no window", spec(|_| {}), &[], None, Window::Open),
        ("keeping needs no window", spec(|_| {}), &[], Some("2.0.0"), Window::Open),
        (
            "the default policy's next window",
            spec(|_| {}),
            &default_later,
            upgrade,
            Window::Wait {
                from: v("1.0.0"),
                message:
                    "upgrade to 2.0.0 waits for the maintenance window 2026-11-27T13:00:00Z – 2026-11-27T15:00:00Z"
                        .into(),
                next: "2026-11-27T13:00:00Z/2026-11-27T15:00:00Z".into(),
                opens_in: Duration::from_secs(3600),
            },
        ),
        (
            "the named policy's window is open",
            spec(|s| s.maintenance_policy = Some("weekly".into())),
            &named_inside,
            upgrade,
            Window::Open,
        ),
        (
            "a named policy that does not exist fails closed",
            spec(|s| s.maintenance_policy = Some("typo".into())),
            &named_inside,
            upgrade,
            held("held: maintenance policy kcp/typo not found", Some(Duration::from_secs(60))),
        ),
        (
            "no policy at all fails closed",
            spec(|_| {}),
            &[],
            upgrade,
            held(
                "held: no maintenance window is configured: name a MaintenancePolicy (maintenancePolicy), create \
                 one called default in namespace kcp, set maintenanceWindows, or set skipMaintenanceWindows",
                Some(Duration::from_secs(60)),
            ),
        ),
    ];
    for (what, rt, policies, running, want) in cases {
        let stores = Stores { ns: NS, templates: &[], metas: &[], policies };
        let got = match decide_app(&rt, stores, &downtime, &entry("app"), running, &[]) {
            Decision::Change(c) => c.window,
            other => panic!("{what}: {other:?}"),
        };
        assert_eq!(got, want, "{what}");
    }
    // Windows that cannot be used: an invalid policy is held and looked at again; a window
    // too short or only in the past is held until something changes.
    let cases: Vec<HeldCase<'_>> = vec![
        (
            "an invalid policy",
            spec(|_| {}),
            &broken,
            "held: maintenance policy kcp/default is invalid",
            Some(Duration::from_secs(60)),
        ),
        ("too little of the window left", own(&ending), &[], "needs downtime but no maintenance window", None),
        ("only a past window", own(&past), &[], "needs downtime but no maintenance window", None),
    ];
    for (what, rt, policies, says, look) in cases {
        let stores = Stores { ns: NS, templates: &[], metas: &[], policies };
        match decide_app(&rt, stores, &downtime, &entry("app"), upgrade, &[]) {
            Decision::Change(Change { window: Window::Hold { from, message, look_again }, .. }) => {
                assert_eq!(from, v("1.0.0"), "{what}");
                assert!(message.starts_with("upgrade to 2.0.0 ") && message.contains(says), "{what}: {message}");
                assert_eq!(look_again, look, "{what}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
}

#[test]
fn modules_are_reconciled_after_what_their_desired_version_requires() {
    let templates = [
        tpl("app", "1.0.0", &["istio"], false),
        tpl("istio", "1.0.0", &["certs"], false),
        tpl("certs", "1.0.0", &[], false),
    ];
    let metas = [
        meta("app", &[("regular", "1.0.0")]),
        meta("istio", &[("regular", "1.0.0")]),
        meta("certs", &[("regular", "1.0.0")]),
    ];
    let stores = Stores { ns: NS, templates: &templates, metas: &metas, policies: &[] };
    let cases: [(&[&str], &[usize]); 4] = [
        (&["app", "istio", "certs"], &[2, 1, 0]),
        (&["certs", "app", "istio"], &[0, 2, 1]),
        // A module without a release meta keeps its place.
        (&["ghost", "app", "istio"], &[0, 2, 1]),
        (&[], &[]),
    ];
    for (modules, want) in cases {
        assert_eq!(order(&runtime_with(modules), &stores), want, "{modules:?}");
    }
}

#[test]
fn a_failed_module_waits_out_its_backoff_unless_something_could_unblock_it() {
    let failed_at = |step, next: &str| ModuleStatus {
        state: State::Error,
        desired_version: Some("1.0.0".into()),
        retry: Some(ModuleRetry { step, failures: 2, next_attempt: next.into() }),
        ..status("m", State::Error, None)
    };
    let later = "2026-11-27T12:05:00Z";
    let earlier = "2026-11-27T11:55:00Z";
    let apply_later = failed_at(FailedStep::Apply, later);
    let mut recovered = apply_later.clone();
    recovered.state = State::Ready;
    let cases = [
        ("not due, nothing changed", failed_at(FailedStep::Apply, later), false, "1.0.0", false, true),
        ("due", failed_at(FailedStep::Apply, earlier), false, "1.0.0", false, false),
        ("unreadable next attempt counts as due", failed_at(FailedStep::Apply, "soon"), false, "1.0.0", false, false),
        ("the spec changed", failed_at(FailedStep::Apply, later), true, "1.0.0", false, false),
        ("another desired version", failed_at(FailedStep::Apply, later), false, "1.1.0", false, false),
        ("its cluster moved", failed_at(FailedStep::Apply, later), false, "1.0.0", true, false),
        // Resolving touches no cluster: always tried again.
        ("a resolve failure", failed_at(FailedStep::Resolve, later), false, "1.0.0", false, false),
        ("not failed", recovered, false, "1.0.0", false, false),
    ];
    for (what, previous, spec_changed, desired, cluster_moved, want) in cases {
        let f = Failed { previous: &previous, spec_changed, desired: Some(desired.into()), cluster_moved };
        assert_eq!(held_back(&f, now()), want, "{what}");
    }
}

#[test]
fn a_rollout_counts_the_runtimes_of_the_namespace_that_want_the_version_by_channel() {
    let metas = [meta("app", &[("regular", "1.0.0"), ("fast", "2.0.0")])];
    let stores = Stores { ns: NS, templates: &[], metas: &metas, policies: &[] };
    let rt = |name: &str, ns: &str, channel: Option<&str>, e: ModuleEntry| {
        let mut r =
            runtime(RuntimeSpec { channel: channel.map(str::to_string), modules: vec![e], ..Default::default() });
        r.metadata.name = Some(name.into());
        r.metadata.namespace = Some(ns.into());
        Arc::new(r)
    };
    let fleet = [
        rt("a", NS, Some("fast"), entry("app")),
        rt("b", NS, None, ModuleEntry { channel: Some("fast".into()), ..entry("app") }),
        rt("regular", NS, None, entry("app")),
        rt("pinned", NS, Some("fast"), ModuleEntry { version: Some("2.0.0".into()), ..entry("app") }),
        rt("unmanaged", NS, Some("fast"), ModuleEntry { managed: false, ..entry("app") }),
        rt("elsewhere", "other", Some("fast"), entry("app")),
        rt("other-module", NS, Some("fast"), entry("redis")),
    ];
    assert_eq!(rollout_total(&fleet, &stores, "app", &v("2.0.0")), 2);
    assert_eq!(rollout_total(&fleet, &stores, "app", &v("1.0.0")), 1);
    assert_eq!(rollout_total(&fleet, &stores, "redis", &v("2.0.0")), 0);
}

#[test]
fn the_default_configuration_is_created_once() {
    let cases = [
        // (recorded in the cached status, recorded in the API server's) → create
        (false, false, true),
        (true, false, false),
        (false, true, false),
        (true, true, false),
    ];
    for (recorded, in_api_server, want) in cases {
        assert_eq!(create_default_config(recorded, in_api_server), want, "{recorded} {in_api_server}");
    }
}

#[test]
fn removal_follows_the_deletion_strategy_and_waits_for_dependents() {
    let dependents = vec!["app 1.0.0".to_string(), "web 2.0.0".to_string()];
    let cases = [
        (CustomResourcePolicy::Ignore, vec![], Removal::LetGo),
        // Ignore deletes nothing, so nothing can break a dependent.
        (CustomResourcePolicy::Ignore, dependents.clone(), Removal::LetGo),
        (CustomResourcePolicy::CreateAndDelete, vec![], Removal::Delete),
        (
            CustomResourcePolicy::CreateAndDelete,
            dependents,
            Removal::Wait("removal waits: required by app 1.0.0, web 2.0.0".into()),
        ),
    ];
    for (policy, blocking, want) in cases {
        assert_eq!(removal(policy, &blocking), want, "{policy:?} {blocking:?}");
    }
}

#[test]
fn a_deletion_waits_while_managed_resources_are_left() {
    let left = |v: &[(&str, usize)]| v.iter().map(|(k, n)| (k.to_string(), *n)).collect::<Vec<_>>();
    let cases = [
        (left(&[]), None),
        (left(&[("Widget", 0), ("Gadget", 0)]), None),
        (left(&[("Widget", 3)]), Some("waiting for managed resources to be deleted: 3 Widget")),
        (
            left(&[("Widget", 3), ("Gadget", 0), ("Gizmo", 1)]),
            Some("waiting for managed resources to be deleted: 3 Widget, 1 Gizmo"),
        ),
    ];
    for (counts, want) in cases {
        assert_eq!(deletion_blocked(&counts).as_deref(), want, "{counts:?}");
    }
}

#[test]
fn unmanaged_modules_say_what_runs_and_who_still_requires_them() {
    assert_eq!(unmanaged_message(Some("1.2.0")), "not managed by fleetwatch; 1.2.0 is installed");
    assert_eq!(unmanaged_message(None), "not managed by fleetwatch; nothing of it is installed");
    assert_eq!(
        still_required_message(&["app 1.0.0".into(), "web 2.0.0".into()]),
        "not unmanaged yet: required by app 1.0.0, web 2.0.0 (managed until none is)"
    );
}

#[test]
fn the_next_look_is_the_soonest_of_what_is_pending() {
    let s = Duration::from_secs;
    let hour = Some(s(3600));
    let p = Pending::default;
    let cases = [
        ("nothing pending: the resync", p(), hour, hour),
        ("nothing pending, no resync", p(), None, None),
        ("busy", Pending { busy: true, window: Some(s(30)), ..p() }, hour, Some(BUSY_REQUEUE)),
        // A window: when it opens, at most every 2 s, at least 1 s away.
        ("a window in an hour", Pending { window: Some(s(3600)), ..p() }, hour, Some(s(2))),
        ("a window in a moment", Pending { window: Some(Duration::from_millis(10)), ..p() }, hour, Some(s(1))),
        ("a rollout wave", Pending { waiting: true, ..p() }, hour, Some(s(10))),
        ("a window before a wave", Pending { waiting: true, window: Some(s(60)), ..p() }, hour, Some(s(2))),
        ("a pull sooner than the resync", Pending { pull: Some(s(5)), ..p() }, hour, Some(s(5))),
        ("a retry sooner than the wave", Pending { waiting: true, retry: Some(s(3)), ..p() }, hour, Some(s(3))),
        ("a retry without a resync", Pending { retry: Some(s(300)), ..p() }, None, Some(s(300))),
        ("the certificate's renewal first", Pending { busy: true, renew: Some(s(1)), ..p() }, hour, Some(s(1))),
        ("only the certificate's renewal", Pending { renew: Some(s(7200)), ..p() }, None, Some(s(7200))),
    ];
    for (what, pending, resync, want) in cases {
        assert_eq!(requeue(&pending, resync), want, "{what}");
    }
}

#[test]
fn a_module_set_to_unmanaged_stays_managed_while_installed_modules_require_it() {
    let templates = [tpl("app", "1.0.0", &["istio"], false), tpl("istio", "1.0.0", &[], false)];
    let stores = Stores { ns: NS, templates: &templates, metas: &[], policies: &[] };
    let unmanaged = ModuleEntry { managed: false, ..entry("istio") };
    let app = status("app", State::Ready, Some("1.0.0"));
    let app_let_go = status("app", State::Unmanaged, Some("1.0.0"));
    let app_not_installed = status("app", State::Processing, None);
    let cases = [
        ("managed", entry("istio"), vec![app.clone()], Management::Manage),
        (
            "required by an installed module",
            unmanaged.clone(),
            vec![app],
            Management::StillRequired(vec!["app 1.0.0".into()]),
        ),
        ("its dependent let go", unmanaged.clone(), vec![app_let_go], Management::Unmanage),
        ("its dependent not installed", unmanaged.clone(), vec![app_not_installed], Management::Unmanage),
        ("nothing requires it", unmanaged, vec![], Management::Unmanage),
    ];
    for (what, e, known, want) in cases {
        assert_eq!(management(&e, &known, &stores), want, "{what}");
    }
}

#[test]
fn modules_whose_entry_is_gone_are_removed_unless_let_go_before() {
    let rt = runtime_with(&["kept"]);
    let previous = [
        status("kept", State::Ready, Some("1.0.0")),
        status("removed", State::Ready, Some("1.0.0")),
        status("let-go", State::Unmanaged, Some("1.0.0")),
        status("deleting", State::Deleting, Some("1.0.0")),
    ];
    let names: Vec<&str> = gone(&rt, &previous).iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["removed", "deleting"]);
    let installed = installed_of(&previous);
    assert_eq!(
        installed,
        [("kept".into(), "1.0.0".into()), ("removed".into(), "1.0.0".into()), ("deleting".into(), "1.0.0".into())]
    );
}
