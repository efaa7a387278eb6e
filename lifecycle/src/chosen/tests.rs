//! The self-service rules, one table per rule.

use std::sync::Arc;

use fleetwatch_api::chosen::{ChosenBy, Module, ModuleSpec, ModuleState, SOURCE_LABEL, SelfService};
use fleetwatch_api::{
    ChannelVersion, CustomResourcePolicy, ModuleEntry, ModuleReason, ModuleReleaseMeta, ModuleReleaseMetaSpec,
    ModuleStatus, Runtime, RuntimeSpec, State,
};

use super::*;

fn meta(name: &str, channels: &[&str]) -> Arc<ModuleReleaseMeta> {
    let mut m = ModuleReleaseMeta::new(
        name,
        ModuleReleaseMetaSpec {
            module_name: name.into(),
            channels: channels
                .iter()
                .map(|c| ChannelVersion { channel: (*c).into(), version: "1.0.0".into() })
                .collect(),
            ..Default::default()
        },
    );
    m.metadata.namespace = Some("kcp".into());
    Arc::new(m)
}

fn runtime(central: &[&str], self_service: Option<SelfService>) -> Runtime {
    let mut rt = Runtime::new(
        "rt-1",
        RuntimeSpec {
            modules: central.iter().map(|n| ModuleEntry { name: (*n).into(), ..Default::default() }).collect(),
            self_service,
            ..Default::default()
        },
    );
    rt.metadata.namespace = Some("kcp".into());
    rt
}

fn object(name: &str, channel: Option<&str>) -> Listed {
    Listed {
        object: Module::new(name, ModuleSpec { channel: channel.map(String::from), ..Default::default() }),
        invalid: None,
    }
}

fn kept(name: &str) -> Listed {
    let mut o = object(name, None);
    o.object.metadata.labels = Some([(SOURCE_LABEL.to_string(), "central".to_string())].into());
    o
}

fn deleting(mut o: Listed, policy: CustomResourcePolicy) -> Listed {
    o.object.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
    o.object.spec.custom_resource_policy = policy;
    o
}

fn users_status(name: &str) -> ModuleStatus {
    ModuleStatus {
        name: name.into(),
        state: State::Ready,
        source: Some(ChosenBy::User),
        channel: Some("regular".into()),
        actual_version: Some("1.0.0".into()),
        ..Default::default()
    }
}

fn metas() -> Vec<Arc<ModuleReleaseMeta>> {
    vec![meta("redis", &["regular", "fast"]), meta("keda", &["regular"]), meta("nats", &["regular"])]
}

#[test]
fn users_choices_are_taken_up_or_refused_with_a_named_reason() {
    let only_redis = SelfService { modules: Some(vec!["red*".into()]), ..Default::default() };
    let off = SelfService { enabled: false, modules: None };
    // (self-service, object, verdict's reason or None when taken up)
    let cases: [(Option<SelfService>, Listed, Option<Refusal>); 6] = [
        (None, object("redis", Some("fast")), None),
        (None, object("redis", None), None),
        (None, object("istio", None), Some(Refusal::UnknownModule)),
        (None, object("redis", Some("nightly")), Some(Refusal::UnknownChannel)),
        (Some(only_redis), object("keda", None), Some(Refusal::NotAllowed)),
        (Some(off), object("redis", None), Some(Refusal::SelfServiceDisabled)),
    ];
    for (self_service, o, want) in cases {
        let rt = runtime(&[], self_service);
        let m = merge(&rt, "kcp", std::slice::from_ref(&o), &metas(), &[]);
        let name = o.name();
        match (want, &m.verdicts[&name]) {
            (None, Verdict::User) => {
                assert_eq!(m.entries.len(), 1);
                assert_eq!(m.entries[0].channel, o.object.spec.channel, "{name}: the object's channel is the entry's");
                assert!(m.entries[0].managed);
            }
            (Some(reason), Verdict::Refused { reason: got, message }) => {
                assert_eq!(*got, reason, "{name}");
                assert!(message.contains(&name), "the message names the module: {message}");
                assert!(m.entries.is_empty(), "a refused choice never taken up is not reconciled: {name}");
            }
            (want, got) => panic!("{name}: wanted {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn central_listing_takes_precedence_over_a_users_object() {
    let rt = runtime(&["redis"], None);
    let m = merge(&rt, "kcp", &[object("redis", Some("fast")), kept("keda")], &metas(), &[]);
    assert_eq!(m.verdicts["redis"], Verdict::Central { kept: false });
    assert!(m.entries.is_empty(), "the Runtime's entry is in force, not the user's channel");
    assert_eq!(m.verdicts["keda"], Verdict::Stale, "a kept object of a module no longer listed goes");
    let effective = m.runtime(Arc::new(rt.clone()));
    assert_eq!(effective.spec.modules.len(), 1);
}

#[test]
fn a_refusal_never_deletes_a_module_taken_up_before() {
    let off = SelfService { enabled: false, modules: None };
    let rt = runtime(&[], Some(off));
    let m = merge(&rt, "kcp", &[object("redis", None)], &metas(), &[users_status("redis")]);
    assert!(matches!(m.verdicts["redis"], Verdict::Refused { reason: Refusal::SelfServiceDisabled, .. }));
    assert_eq!(m.entries.len(), 1);
    assert!(!m.entries[0].managed, "left as it runs, unmanaged");
    assert_eq!(m.entries[0].channel.as_deref(), Some("regular"));
    assert!(crate::plan::gone(&m.runtime(Arc::new(rt)), &[users_status("redis")]).is_empty());
}

#[test]
fn deleting_a_users_object_removes_its_module_by_the_objects_policy() {
    let rt = runtime(&[], None);
    for policy in [CustomResourcePolicy::CreateAndDelete, CustomResourcePolicy::Ignore] {
        let o = deleting(object("redis", None), policy);
        let previous = [users_status("redis")];
        let m = merge(&rt, "kcp", &[o], &metas(), &previous);
        assert_eq!(m.verdicts["redis"], Verdict::Deleting);
        assert_eq!(m.removal.get("redis"), Some(&policy));
        let effective = m.runtime(Arc::new(rt.clone()));
        let gone: Vec<&str> = crate::plan::gone(&effective, &previous).iter().map(|p| p.name.as_str()).collect();
        assert_eq!(gone, ["redis"]);
    }
    // A module the Runtime lists stays whatever happens to the object.
    let central = runtime(&["redis"], None);
    let m = merge(
        &central,
        "kcp",
        &[deleting(object("redis", None), CustomResourcePolicy::CreateAndDelete)],
        &metas(),
        &[],
    );
    assert_eq!(m.verdicts["redis"], Verdict::Central { kept: false });
    assert!(m.removal.is_empty());
}

#[test]
fn objects_show_states_users_read() {
    let st = |state: State, reason: Option<ModuleReason>| ModuleStatus {
        name: "m".into(),
        state,
        reason,
        ..Default::default()
    };
    let cases = [
        (st(State::Ready, None), ModuleState::Ready),
        (st(State::Processing, None), ModuleState::Processing),
        (st(State::Processing, Some(ModuleReason::WaitingForDependency)), ModuleState::Waiting),
        (st(State::Processing, Some(ModuleReason::WaitingForManager)), ModuleState::Waiting),
        (st(State::Warning, Some(ModuleReason::DowngradeRefused)), ModuleState::Warning),
        (st(State::Unmanaged, None), ModuleState::Warning),
        (st(State::Deleting, Some(ModuleReason::DeletionBlocked)), ModuleState::Deleting),
        (st(State::Error, None), ModuleState::Error),
    ];
    for (module, want) in cases {
        assert_eq!(state_of(&module), want, "{module:?}");
    }
}

#[test]
fn an_objects_status_says_who_chose_it_and_why() {
    let module = ModuleStatus {
        name: "redis".into(),
        state: State::Warning,
        reason: Some(ModuleReason::DowngradeRefused),
        message: "2.0.0 runs, newer than 1.0.0 of channel regular: not downgraded".into(),
        actual_version: Some("2.0.0".into()),
        desired_version: Some("1.0.0".into()),
        channel: Some("regular".into()),
        ..Default::default()
    };
    let s = object_status(&Verdict::User, Some(&module), "kcp/rt-1", Some(3), false, None);
    assert_eq!(s.state, Some(ModuleState::Warning));
    assert_eq!((s.version.as_deref(), s.desired_version.as_deref()), (Some("2.0.0"), Some("1.0.0")));
    assert_eq!(s.source, Some(ChosenBy::User));
    assert_eq!(s.observed_generation, Some(3));
    let ready = s.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "DowngradeRefused"));

    let central = object_status(&Verdict::Central { kept: true }, Some(&module), "kcp/rt-1", Some(1), true, None);
    let accepted = central.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
    assert_eq!(accepted.reason, "PutBack");
    assert!(accepted.message.contains("kcp/rt-1"), "{}", accepted.message);

    let refused =
        Verdict::Refused { reason: Refusal::UnknownChannel, message: "module redis has no channel \"nightly\"".into() };
    let r = object_status(&refused, None, "kcp/rt-1", Some(1), false, None);
    assert_eq!(r.state, Some(ModuleState::Error));
    let accepted = r.conditions.iter().find(|c| c.type_ == "Accepted").unwrap();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "UnknownChannel"));
    // Written again only when something but a transition time changed.
    let mut again = r.clone();
    again.conditions.iter_mut().for_each(|c| c.last_transition_time = Some("2000-01-01T00:00:00Z".into()));
    assert!(same_status(&r, &again));
    assert!(!same_status(&r, &s));
}

#[test]
fn a_kept_objects_spec_follows_the_runtime() {
    let entry = ModuleEntry { name: "redis".into(), channel: Some("fast".into()), ..Default::default() };
    let v = central_object(&entry);
    assert_eq!(v["metadata"]["labels"][SOURCE_LABEL], "central");
    assert_eq!(v["spec"]["channel"], "fast");
    let o: Module = serde_json::from_value(v).unwrap();
    assert!(central_spec_matches(&o, &entry));
    let rechannelled = Module::new("redis", ModuleSpec { channel: Some("regular".into()), ..Default::default() });
    assert!(!central_spec_matches(&rechannelled, &entry));
}

#[test]
fn objects_that_cannot_be_read_leave_the_users_modules_alone() {
    let rt = runtime(&["keda"], None);
    let central = ModuleStatus { name: "keda".into(), state: State::Ready, ..Default::default() };
    let previous = [users_status("redis"), central];
    let m = Merged::unread(&rt, &previous, "connection refused");
    assert_eq!(m.unread.len(), 1, "only the users' modules: the Runtime's are reconciled as ever");
    let redis = &m.unread[0];
    assert_eq!((redis.name.as_str(), redis.state), ("redis", State::Error));
    assert!(redis.message.contains("connection refused"), "{}", redis.message);
    assert_eq!(redis.actual_version.as_deref(), Some("1.0.0"), "what runs is still said");
    assert!(m.entries.is_empty() && m.users().contains("redis"));
}

#[test]
fn looks_across_runtimes_see_the_users_modules_as_last_recorded() {
    let mut rt = runtime(&["keda"], None);
    let unmanaged = ModuleStatus { state: State::Unmanaged, ..users_status("nats") };
    let central_status = ModuleStatus { name: "keda".into(), state: State::Ready, ..Default::default() };
    rt.status = Some(fleetwatch_api::RuntimeStatus {
        modules: vec![central_status, users_status("redis"), unmanaged],
        ..Default::default()
    });
    let all = listed_and_chosen(&rt);
    let names: Vec<(&str, bool)> = all.iter().map(|e| (e.name.as_str(), e.managed)).collect();
    assert_eq!(names, [("keda", true), ("redis", true), ("nats", false)]);
    assert_eq!(all[1].channel.as_deref(), Some("regular"), "the channel in force when recorded");
    // So a channel move of redis reaches this Runtime, and a rollout counts it.
    let metas = metas();
    let stores = crate::plan::Stores { ns: "kcp", templates: &[], metas: &metas, policies: &[] };
    let fleet = [Arc::new(rt)];
    assert_eq!(crate::plan::rollout_total(&fleet, &stores, "redis", &semver::Version::new(1, 0, 0)), 1);
}
