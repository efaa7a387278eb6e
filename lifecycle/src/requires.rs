//! Dependencies between modules: a ModuleTemplate's `spec.requires` names modules (and
//! optionally a semver range of their versions) that must be installed and Ready in the
//! same runtime before anything of it is applied.
//!
//! - A module whose requirement is not met waits (`WaitingForDependency`): `Processing` while
//!   the required module is in the Runtime and on its way, `Warning` when the Runtime does
//!   not list it at all (someone must add it). It starts as soon as the dependency is Ready:
//!   the dependency's manager becoming Ready is an agent inventory event for the cluster.
//! - Modules are reconciled in dependency order, so a dependency installed in the same
//!   reconcile comes first.
//! - A dependency is not removed while an installed module requires it (`RequiredByOthers`,
//!   naming the dependent); removing both removes the dependent first.
//! - A requirement no channel of the required module can satisfy, one whose range does not
//!   parse, and a cycle make the template `Usable=False` ([`judge`]), and a Runtime wanting
//!   that version shows the module in `Error`.
//!
//! Everything here is pure: the reconcile and the template status writer call it with what
//! their stores hold.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fleetwatch_api::policy::parse;
use fleetwatch_api::{ModuleReleaseMeta, ModuleRequirement, ModuleStatus, ModuleTemplate, State};
use kube::ResourceExt;

/// Why a module cannot start yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmet {
    /// The required module is in the Runtime (on its way): only waiting is needed.
    pub listed: bool,
    /// For people: which module, what it is now.
    pub message: String,
}

/// Whether every requirement is met by the runtime's modules as known now (this reconcile's
/// statuses of the modules done before, else the last ones): installed, `Ready` (or left
/// unmanaged with a running version), and in the range. The first unmet one otherwise.
pub fn unmet(requires: &[ModuleRequirement], known: &[ModuleStatus], listed: &[&str]) -> Option<Unmet> {
    for req in requires {
        let is_listed = listed.contains(&req.module.as_str());
        let st = known.iter().find(|m| m.name == req.module);
        let wait = |message: String| Some(Unmet { listed: is_listed, message });
        if !is_listed {
            return wait(format!(
                "waits for module {req}: it is not in this Runtime's modules (add it to spec.modules)"
            ));
        }
        let Some(st) = st else {
            return wait(format!("waits for module {req} to be installed and Ready (not installed yet)"));
        };
        let running = st.actual_version.as_deref().or(st.installed_version.as_deref());
        let fine = matches!(st.state, State::Ready | State::Unmanaged) && running.is_some();
        if !fine {
            let detail = if st.message.is_empty() { String::new() } else { format!(": {}", st.message) };
            return wait(format!("waits for module {req} to be installed and Ready (it is {}{detail})", st.state));
        }
        let Some(running) = running else { continue };
        match parse(running).map_err(|e| e.to_string()).and_then(|v| req.accepts(&v)) {
            Ok(true) => {}
            Ok(false) => return wait(format!("waits for module {req}: it runs {running}")),
            Err(e) => return wait(format!("waits for module {req}: {e}")),
        }
    }
    None
}

/// Indices of `modules` (name, the modules its desired version requires) in dependency
/// order: a module after those it requires, otherwise in the order given (a cycle keeps it).
pub fn order(modules: &[(String, Vec<String>)]) -> Vec<usize> {
    let mut done: Vec<usize> = Vec::with_capacity(modules.len());
    let mut placed = vec![false; modules.len()];
    let index: BTreeMap<&str, usize> = modules.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
    while done.len() < modules.len() {
        // The first module whose listed requirements are all placed; in a cycle, the first left.
        let ready = (0..modules.len()).find(|&i| {
            !placed[i] && modules[i].1.iter().all(|r| index.get(r.as_str()).is_none_or(|&j| placed[j] || j == i))
        });
        let Some(i) = ready.or_else(|| (0..modules.len()).find(|&i| !placed[i])) else { break };
        placed[i] = true;
        done.push(i);
    }
    done
}

/// The template of `module` at `version` in namespace `ns`.
pub fn template_of<'a>(
    templates: &'a [Arc<ModuleTemplate>],
    ns: &str,
    module: &str,
    version: &str,
) -> Option<&'a Arc<ModuleTemplate>> {
    let v = parse(version).ok()?;
    templates.iter().find(|t| {
        t.spec.module_name == module
            && t.namespace().as_deref() == Some(ns)
            && parse(&t.spec.version).is_ok_and(|tv| tv == v)
    })
}

/// Installed modules (name, installed version) that require `module`, by their installed
/// version's template: what must go before it may.
pub fn dependents(
    module: &str,
    installed: &[(String, String)],
    templates: &[Arc<ModuleTemplate>],
    ns: &str,
) -> Vec<String> {
    installed
        .iter()
        .filter(|(name, _)| name != module)
        .filter(|(name, version)| {
            template_of(templates, ns, name, version)
                .is_some_and(|t| t.spec.requires.iter().any(|r| r.module == module))
        })
        .map(|(name, version)| format!("{name} {version}"))
        .collect()
}

/// What is wrong with a template's requirements among the other templates and release
/// metas of its namespace: a range that does not parse, a module requiring itself, a
/// requirement no channel (nor the mandatory version) of the required module satisfies, or
/// a cycle (`a → b → a`). `Ok` when there are none or all can be met.
pub fn judge(
    t: &ModuleTemplate,
    templates: &[Arc<ModuleTemplate>],
    metas: &[Arc<ModuleReleaseMeta>],
) -> Result<(), String> {
    let ns = t.namespace();
    let module = &t.spec.module_name;
    for req in &t.spec.requires {
        if &req.module == module {
            return Err(format!("spec.requires: module {module} requires itself"));
        }
        if let Some(range) = &req.versions {
            semver::VersionReq::parse(range)
                .map_err(|e| format!("spec.requires: {}: versions {range:?} is not a semver range: {e}", req.module))?;
        }
        let meta = metas.iter().find(|m| m.spec.module_name == req.module && m.namespace() == ns);
        let Some(meta) = meta else {
            return Err(format!(
                "spec.requires: no ModuleReleaseMeta for module {} in namespace {}: nothing can satisfy {req}",
                req.module,
                ns.as_deref().unwrap_or_default()
            ));
        };
        let offered: Vec<(String, String)> = meta
            .spec
            .channels
            .iter()
            .map(|c| (c.channel.clone(), c.version.clone()))
            .chain(meta.spec.mandatory.iter().map(|v| ("mandatory".to_string(), v.clone())))
            .collect();
        let any = offered.iter().any(|(_, v)| parse(v).ok().is_some_and(|v| req.accepts(&v).unwrap_or(false)));
        if !any {
            let list: Vec<String> = offered.iter().map(|(c, v)| format!("{c}={v}")).collect();
            return Err(format!(
                "spec.requires: no channel of module {} offers a version in {} (it offers {})",
                req.module,
                req.versions.as_deref().unwrap_or("any"),
                if list.is_empty() { "none".to_string() } else { list.join(", ") }
            ));
        }
    }
    if let Some(path) = cycle(t, templates) {
        return Err(format!("spec.requires: a cycle of requirements: {}", path.join(" → ")));
    }
    Ok(())
}

/// A path of requirements from the template's module back to itself, through any version's
/// template of the namespace, if there is one.
fn cycle(t: &ModuleTemplate, templates: &[Arc<ModuleTemplate>]) -> Option<Vec<String>> {
    let ns = t.namespace();
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for other in templates.iter().filter(|o| o.namespace() == ns) {
        edges
            .entry(other.spec.module_name.as_str())
            .or_default()
            .extend(other.spec.requires.iter().map(|r| r.module.as_str()));
    }
    // This template's own requirements, whether or not the store has it yet.
    let start = t.spec.module_name.as_str();
    let first: BTreeSet<&str> = t.spec.requires.iter().map(|r| r.module.as_str()).collect();
    // Depth-first from each requirement, remembering the path.
    let mut stack: Vec<(Vec<&str>, &str)> = first.iter().map(|r| (vec![start], *r)).collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    while let Some((path, at)) = stack.pop() {
        if at == start {
            let mut p: Vec<String> = path.iter().map(|s| s.to_string()).collect();
            p.push(start.to_string());
            return Some(p);
        }
        if !seen.insert(at) {
            continue;
        }
        for next in edges.get(at).into_iter().flatten() {
            let mut p = path.clone();
            p.push(at);
            stack.push((p, next));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::{ChannelVersion, ModuleReleaseMetaSpec, ModuleTemplateSpec};

    #[test]
    fn a_requirement_is_met_by_a_ready_module_in_range() {
        use super::unmet;
        use fleetwatch_api::{ModuleRequirement, ModuleStatus, State};
        let req = [ModuleRequirement { module: "istio".into(), versions: Some(">=1.2".into()) }];
        let ready = ModuleStatus {
            name: "istio".into(),
            state: State::Ready,
            actual_version: Some("1.4.0".into()),
            ..Default::default()
        };
        assert_eq!(unmet(&req, std::slice::from_ref(&ready), &["istio"]), None);
        let old = ModuleStatus { actual_version: Some("1.1.0".into()), ..ready };
        assert!(unmet(&req, &[old], &["istio"]).unwrap().message.contains("runs 1.1.0"));
        assert!(!unmet(&req, &[], &[]).unwrap().listed);
    }

    #[test]
    fn modules_come_after_those_they_require() {
        use super::order;
        let m = |n: &str, r: &[&str]| (n.to_string(), r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            order(&[m("app", &["istio"]), m("redis", &[]), m("istio", &["certs"]), m("certs", &[])]),
            [1, 3, 2, 0]
        );
    }

    fn tpl(module: &str, version: &str, requires: &[(&str, Option<&str>)]) -> Arc<ModuleTemplate> {
        let mut t = ModuleTemplate::new(
            &format!("{module}-{version}"),
            ModuleTemplateSpec {
                module_name: module.into(),
                version: version.into(),
                requires: requires
                    .iter()
                    .map(|(m, v)| ModuleRequirement { module: m.to_string(), versions: v.map(str::to_string) })
                    .collect(),
                ..Default::default()
            },
        );
        t.metadata.namespace = Some("kcp".into());
        Arc::new(t)
    }

    fn meta(module: &str, channels: &[(&str, &str)]) -> Arc<ModuleReleaseMeta> {
        let mut m = ModuleReleaseMeta::new(
            module,
            ModuleReleaseMetaSpec {
                module_name: module.into(),
                channels: channels
                    .iter()
                    .map(|(c, v)| ChannelVersion { channel: c.to_string(), version: v.to_string() })
                    .collect(),
                ..Default::default()
            },
        );
        m.metadata.namespace = Some("kcp".into());
        Arc::new(m)
    }

    fn status(name: &str, state: State, version: Option<&str>) -> ModuleStatus {
        ModuleStatus { name: name.into(), state, actual_version: version.map(str::to_string), ..Default::default() }
    }

    #[test]
    fn requirements_are_met_only_by_a_ready_module_in_range() {
        let req = [ModuleRequirement { module: "istio".into(), versions: Some("^1.2".into()) }];
        let cases: &[(&[ModuleStatus], &[&str], Option<bool>)] = &[
            (&[], &[], Some(false)),                                                   // not listed
            (&[], &["istio"], Some(true)),                                             // listed, no status yet
            (&[status("istio", State::Processing, None)], &["istio"], Some(true)),     // on its way
            (&[status("istio", State::Error, Some("1.3.0"))], &["istio"], Some(true)), // failing
            (&[status("istio", State::Ready, Some("2.0.0"))], &["istio"], Some(true)), // out of range
            (&[status("istio", State::Ready, Some("1.3.0"))], &["istio"], None),       // met
            (&[status("istio", State::Unmanaged, Some("1.3.0"))], &["istio"], None),   // left as it is, runs
            (&[status("istio", State::Ready, Some("1.3.0"))], &[], Some(false)),       // being removed
        ];
        for (i, (known, listed, want)) in cases.iter().enumerate() {
            assert_eq!(unmet(&req, known, listed).map(|u| u.listed), *want, "case {i}");
        }
        let why = unmet(&req, &[status("istio", State::Error, Some("1.3.0"))], &["istio"]).unwrap().message;
        assert_eq!(why, "waits for module istio ^1.2 to be installed and Ready (it is Error)");
    }

    #[test]
    fn dependency_order_puts_requirements_first_and_survives_cycles() {
        let m = |n: &str, r: &[&str]| (n.to_string(), r.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(order(&[m("a", &["b"]), m("b", &[])]), [1, 0]);
        assert_eq!(order(&[m("a", &["x"]), m("b", &[])]), [0, 1]); // unknown requirement: as given
        assert_eq!(order(&[m("a", &["b"]), m("b", &["a"]), m("c", &[])]), [2, 0, 1]);
        assert_eq!(order(&[]), Vec::<usize>::new());
    }

    #[test]
    fn templates_with_unsatisfiable_or_cyclic_requirements_are_judged_unusable() {
        let metas = [meta("istio", &[("regular", "1.8.0"), ("fast", "1.9.0")]), meta("app", &[("regular", "1.0.0")])];
        let ok = tpl("app", "1.0.0", &[("istio", Some(">=1.8"))]);
        let all = [ok.clone(), tpl("istio", "1.8.0", &[])];
        assert_eq!(judge(&ok, &all, &metas), Ok(()));
        let too_new = tpl("app", "2.0.0", &[("istio", Some(">=2"))]);
        let e = judge(&too_new, &all, &metas).unwrap_err();
        assert_eq!(
            e,
            "spec.requires: no channel of module istio offers a version in >=2 (it offers regular=1.8.0, fast=1.9.0)"
        );
        assert!(
            judge(&tpl("app", "2.0.0", &[("ghost", None)]), &all, &metas)
                .unwrap_err()
                .contains("no ModuleReleaseMeta for module ghost")
        );
        assert!(
            judge(&tpl("app", "2.0.0", &[("istio", Some("not a range"))]), &all, &metas)
                .unwrap_err()
                .contains("not a semver range")
        );
        assert!(judge(&tpl("app", "2.0.0", &[("app", None)]), &all, &metas).unwrap_err().contains("requires itself"));
        // istio 1.9.0 requiring app closes a cycle app → istio → app, seen from both sides.
        let back = tpl("istio", "1.9.0", &[("app", None)]);
        let all = [ok.clone(), back.clone()];
        assert_eq!(judge(&ok, &all, &metas).unwrap_err(), "spec.requires: a cycle of requirements: app → istio → app");
        assert_eq!(
            judge(&back, &all, &metas).unwrap_err(),
            "spec.requires: a cycle of requirements: istio → app → istio"
        );
    }

    #[test]
    fn a_dependency_is_required_by_installed_modules_whose_installed_version_needs_it() {
        let ts = [tpl("app", "1.0.0", &[("istio", None)]), tpl("app", "2.0.0", &[]), tpl("istio", "1.0.0", &[])];
        let installed = |v: &str| vec![("app".to_string(), v.to_string()), ("istio".to_string(), "1.0.0".to_string())];
        assert_eq!(dependents("istio", &installed("1.0.0"), &ts, "kcp"), ["app 1.0.0"]);
        assert!(dependents("istio", &installed("2.0.0"), &ts, "kcp").is_empty());
        assert!(dependents("app", &installed("1.0.0"), &ts, "kcp").is_empty());
    }
}
