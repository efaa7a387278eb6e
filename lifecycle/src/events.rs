//! Kubernetes Events (`events.k8s.io/v1`) on a Runtime for what happened to its modules:
//! install, upgrade, downgrade refused, waiting for a window, upgrade held, deletion
//! blocked, deletion done, errors. One Event per transition (a state or message change),
//! never one per reconcile; repeats become an Event series.

use fleetwatch_api::{ModuleStatus, State};
use kube::runtime::events::{Event, EventType};

/// The Events that the change from `prev` to `next` module statuses deserves.
///
/// ```
/// use fleetwatch_lifecycle::events::transitions;
/// use fleetwatch_api::{ModuleStatus, State};
/// let next = vec![ModuleStatus { name: "redis".into(), state: State::Ready, installed_version: Some("1.0.0".into()), ..Default::default() }];
/// let evs = transitions(&[], &next);
/// assert_eq!(evs[0].reason, "Installed");
/// assert!(transitions(&next, &next).is_empty());
/// ```
pub fn transitions(prev: &[ModuleStatus], next: &[ModuleStatus]) -> Vec<Event> {
    let mut out = Vec::new();
    for n in next {
        let p = prev.iter().find(|p| p.name == n.name);
        let changed = p.is_none_or(|p| p.state != n.state || p.message != n.message);
        let before = p.and_then(|p| p.installed_version.as_deref());
        match (before, n.installed_version.as_deref()) {
            (None, Some(v)) => out.push(normal("Installed", "Install", format!("installed {} {v}", n.name))),
            (Some(a), Some(b)) if a != b => {
                out.push(normal("Upgraded", "Upgrade", format!("upgraded {} from {a} to {b}", n.name)))
            }
            _ => {}
        }
        if !changed {
            continue;
        }
        let msg = format!("{}: {}", n.name, n.message);
        match n.state {
            State::Warning if n.message.contains("downgrade") => out.push(warning("DowngradeRefused", "Upgrade", msg)),
            State::Warning => out.push(warning("UpgradeHeld", "Upgrade", msg)),
            State::Ready if n.message.contains("waits for the maintenance window") => {
                out.push(normal("WaitingForMaintenanceWindow", "Upgrade", msg))
            }
            State::Deleting => out.push(warning("DeletionBlocked", "Delete", msg)),
            State::Error => out.push(warning("Failed", "Reconcile", msg)),
            State::Unmanaged if p.is_none_or(|p| p.state != State::Unmanaged) => {
                out.push(normal("Unmanaged", "Unmanage", msg))
            }
            _ => {}
        }
    }
    for p in prev {
        if !next.iter().any(|n| n.name == p.name) && p.state != State::Unmanaged {
            out.push(normal("Deleted", "Delete", format!("{} removed", p.name)));
        }
    }
    out
}

fn normal(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Normal, reason, action, note)
}

fn warning(reason: &str, action: &str, note: String) -> Event {
    event(EventType::Warning, reason, action, note)
}

fn event(type_: EventType, reason: &str, action: &str, note: String) -> Event {
    // The API server limits an Event's note to 1 KiB.
    let mut note = note;
    if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    Event { type_, reason: reason.into(), note: Some(note), action: action.into(), secondary: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(state: State, installed: Option<&str>, message: &str) -> ModuleStatus {
        ModuleStatus {
            name: "redis".into(),
            state,
            installed_version: installed.map(str::to_string),
            message: message.into(),
            ..Default::default()
        }
    }

    fn reasons(prev: &[ModuleStatus], next: &[ModuleStatus]) -> Vec<String> {
        transitions(prev, next).into_iter().map(|e| e.reason).collect()
    }

    #[test]
    fn one_event_per_transition() {
        let ready1 = m(State::Ready, Some("1.0.0"), "");
        assert_eq!(reasons(&[], std::slice::from_ref(&ready1)), ["Installed"]);
        assert!(reasons(std::slice::from_ref(&ready1), std::slice::from_ref(&ready1)).is_empty());
        let ready2 = m(State::Ready, Some("2.0.0"), "");
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[ready2]), ["Upgraded"]);
        let down = m(State::Warning, Some("1.0.0"), "downgrade from 2.0.0 to 1.0.0 not applied");
        assert_eq!(reasons(std::slice::from_ref(&ready1), std::slice::from_ref(&down)), ["DowngradeRefused"]);
        assert!(reasons(std::slice::from_ref(&down), std::slice::from_ref(&down)).is_empty());
        let waits = m(State::Ready, Some("1.0.0"), "upgrade to 2.0.0 waits for the maintenance window a – b");
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[waits]), ["WaitingForMaintenanceWindow"]);
        let blocked = m(State::Deleting, Some("1.0.0"), "waiting for managed resources to be deleted: 1 X");
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[blocked]), ["DeletionBlocked"]);
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[]), ["Deleted"]);
        let err = m(State::Error, Some("1.0.0"), "boom");
        let evs = transitions(std::slice::from_ref(&ready1), &[err]);
        assert_eq!(evs[0].reason, "Failed");
        assert_eq!(evs[0].type_, EventType::Warning);
        assert_eq!(evs[0].note.as_deref(), Some("redis: boom"));
    }
}
