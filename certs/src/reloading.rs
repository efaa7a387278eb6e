//! A value loaded from files and following them ([`ReloadingFile`]): reloaded when they
//! change, the last good value kept in force when the new files cannot be used, the
//! failure reported once per change and kept (for readiness) until the files are good.
//!
//! The hub's certificates, its deny list, its access policy and its admin token, and a
//! client's certificates, all follow their files this way; the rules live here once so
//! that none of them can drift: nothing ever fails open, a broken file is reported once
//! (not at every check), and a file put back as it was ends the failure.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// How a change of the files is noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// By content, read in full at every check: a file rewritten with its old time stamp
    /// (`cp -p`, a config-management tool, a kubelet swapping a Secret volume) is still
    /// noticed. The content read is handed to the loader, so what is compared is what is
    /// loaded.
    Content,
    /// By modification time (a stat per file per check, for files large or costly to
    /// read).
    Modified,
    /// By modification time and length (a stat per file per check).
    ModifiedAndLength,
}

/// What one file looked like at a check.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// Its content, or why it could not be read.
    Content(Result<Vec<u8>, String>),
    /// Its modification time, if it could be read.
    Modified(Option<SystemTime>),
    /// Its modification time and length, if they could be read.
    ModifiedAndLength(Option<(SystemTime, u64)>),
}

/// The files as a loader receives them, one entry per path in the order given.
#[derive(Debug)]
pub struct Contents {
    files: Vec<(PathBuf, Option<std::io::Result<Vec<u8>>>)>,
}

impl Contents {
    /// The content of the `index`th file: as read for the comparison ([`Compare::Content`]),
    /// else read now. Each content is handed out once; a second take reads the file again.
    pub fn take(&mut self, index: usize) -> std::io::Result<Vec<u8>> {
        let Some((path, read)) = self.files.get_mut(index) else {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("no file number {index}")));
        };
        match read.take() {
            Some(read) => read,
            None => std::fs::read(path),
        }
    }
}

/// What [`ReloadingFile::reload_if_changed`] found.
#[derive(Debug)]
pub enum Reload<E> {
    /// The files are as they were (or still broken in the same way, already reported).
    Unchanged,
    /// The files are back to those the value in force was loaded from, after a failure:
    /// the failure is over and nothing was loaded.
    Recovered,
    /// A new value, loaded from the changed files, is in force.
    Replaced,
    /// The changed files cannot be used: the previous value stays in force. Reported once
    /// per change of the files.
    Failed(E),
}

/// A value loaded from files that follows them (see the module documentation).
pub struct ReloadingFile<T> {
    paths: Vec<PathBuf>,
    compare: Compare,
    state: RwLock<State<T>>,
}

struct State<T> {
    /// What the files looked like when the value in force was loaded.
    seen: Vec<Seen>,
    value: Arc<T>,
    /// What the files looked like when they could not be used, and why.
    failed: Option<(Vec<Seen>, String)>,
}

impl<T> ReloadingFile<T> {
    /// Loads the value from `paths` once. An error is the caller's to refuse: there is no
    /// last good value to keep yet.
    pub fn load<E>(
        paths: Vec<PathBuf>,
        compare: Compare,
        load: impl FnOnce(Contents) -> Result<T, E>,
    ) -> Result<Self, E> {
        let (seen, contents) = look(&paths, compare);
        let value = load(contents)?;
        Ok(Self { paths, compare, state: RwLock::new(State { seen, value: Arc::new(value), failed: None }) })
    }

    /// A value that follows no file: it never changes.
    pub fn fixed(value: T) -> Self {
        Self::load(Vec::new(), Compare::Content, |_| Ok::<_, std::convert::Infallible>(value))
            .unwrap_or_else(|never| match never {})
    }

    /// The files it follows.
    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The value in force.
    pub fn current(&self) -> Arc<T> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).value.clone()
    }

    /// Why the files cannot be used (the value in force is then older than they are), if so.
    pub fn failure(&self) -> Option<String> {
        self.state.read().unwrap_or_else(|p| p.into_inner()).failed.as_ref().map(|(_, why)| why.clone())
    }

    /// Checks the files and, when they changed, loads the value again with `load` (given
    /// the files and the value in force). On error the value in force stays.
    pub fn reload_if_changed<E: std::fmt::Display>(
        &self,
        load: impl FnOnce(Contents, &T) -> Result<T, E>,
    ) -> Reload<E> {
        if self.paths.is_empty() {
            return Reload::Unchanged;
        }
        let (now, contents) = look(&self.paths, self.compare);
        if !self.may_have_changed(&now) {
            return Reload::Unchanged;
        }
        // Checked again under the write lock: another check may have settled it since.
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        if let Some(outcome) = settled(&mut state, &now) {
            return outcome;
        }
        match load(contents, &state.value) {
            Ok(value) => {
                *state = State { seen: now, value: Arc::new(value), failed: None };
                Reload::Replaced
            }
            Err(e) => {
                state.failed = Some((now, e.to_string()));
                Reload::Failed(e)
            }
        }
    }

    /// Whether the files differ from those of the value in force with no failure since, and
    /// from those that failed last: a read-only look first, so that a check that finds
    /// nothing new never waits for a writer.
    fn may_have_changed(&self, now: &[Seen]) -> bool {
        let state = self.state.read().unwrap_or_else(|p| p.into_inner());
        let in_force = state.seen == now && state.failed.is_none();
        let failed_again = state.failed.as_ref().is_some_and(|(failed, _)| failed == now);
        !in_force && !failed_again
    }
}

/// What to answer without loading, if anything: the files are those of the value in force
/// (a failure before is then over) or those that failed last.
fn settled<T, E>(state: &mut State<T>, now: &[Seen]) -> Option<Reload<E>> {
    if state.seen == now {
        return Some(match state.failed.take() {
            Some(_) => Reload::Recovered,
            None => Reload::Unchanged,
        });
    }
    match &state.failed {
        Some((failed, _)) if failed == now => Some(Reload::Unchanged),
        _ => None,
    }
}

/// What the files look like now, and what a loader gets of them.
fn look(paths: &[PathBuf], compare: Compare) -> (Vec<Seen>, Contents) {
    let mut seen = Vec::with_capacity(paths.len());
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        match compare {
            Compare::Content => {
                let read = std::fs::read(path);
                seen.push(Seen::Content(read.as_ref().map(Clone::clone).map_err(|e| e.to_string())));
                files.push((path.clone(), Some(read)));
            }
            Compare::Modified => {
                seen.push(Seen::Modified(std::fs::metadata(path).and_then(|m| m.modified()).ok()));
                files.push((path.clone(), None));
            }
            Compare::ModifiedAndLength => {
                let stamp = std::fs::metadata(path).ok().and_then(|m| Some((m.modified().ok()?, m.len())));
                seen.push(Seen::ModifiedAndLength(stamp));
                files.push((path.clone(), None));
            }
        }
    }
    (seen, Contents { files })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Loads the file as a number; anything else is an error.
    fn number(mut c: Contents) -> Result<u32, String> {
        let bytes = c.take(0).map_err(|e| format!("unreadable: {e}"))?;
        String::from_utf8_lossy(&bytes).trim().parse().map_err(|e| format!("not a number: {e}"))
    }

    fn reload(f: &ReloadingFile<u32>) -> Reload<String> {
        f.reload_if_changed(|c, _| number(c))
    }

    fn set_mtime(path: &Path, t: SystemTime) {
        std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn by_content_a_rewrite_with_the_old_mtime_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let f = ReloadingFile::load(vec![path.clone()], Compare::Content, number).unwrap();
        assert!(matches!(reload(&f), Reload::Unchanged));
        std::fs::write(&path, "2").unwrap();
        set_mtime(&path, mtime);
        assert!(matches!(reload(&f), Reload::Replaced));
        assert_eq!(*f.current(), 2);
        assert!(matches!(reload(&f), Reload::Unchanged));
    }

    #[test]
    fn a_broken_file_keeps_the_last_good_value_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        assert!(ReloadingFile::load(vec![path.clone()], Compare::Content, number).is_err(), "no last good value");
        std::fs::write(&path, "1").unwrap();
        let f = ReloadingFile::load(vec![path.clone()], Compare::Content, number).unwrap();
        std::fs::write(&path, "x").unwrap();
        assert!(matches!(reload(&f), Reload::Failed(e) if e.contains("not a number")));
        assert!(matches!(reload(&f), Reload::Unchanged), "reported once");
        assert_eq!(*f.current(), 1);
        assert!(f.failure().is_some_and(|e| e.contains("not a number")));
        // Gone: another failure, again once.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(reload(&f), Reload::Failed(e) if e.contains("unreadable")));
        assert!(matches!(reload(&f), Reload::Unchanged));
        assert_eq!(*f.current(), 1);
        // Fixed: the new value, and the failure is over.
        std::fs::write(&path, "3").unwrap();
        assert!(matches!(reload(&f), Reload::Replaced));
        assert_eq!(*f.current(), 3);
        assert!(f.failure().is_none());
    }

    #[test]
    fn files_put_back_as_they_were_end_the_failure_without_a_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let f = ReloadingFile::load(vec![path.clone()], Compare::Content, number).unwrap();
        std::fs::write(&path, "x").unwrap();
        assert!(matches!(reload(&f), Reload::Failed(_)));
        std::fs::write(&path, "1").unwrap();
        let outcome = f.reload_if_changed(|_, _| Err::<u32, _>("must not load".to_string()));
        assert!(matches!(outcome, Reload::Recovered));
        assert!(f.failure().is_none());
        assert!(matches!(reload(&f), Reload::Unchanged));
    }

    #[test]
    fn by_time_stamp_only_a_new_stamp_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        for compare in [Compare::Modified, Compare::ModifiedAndLength] {
            std::fs::write(&path, "1").unwrap();
            set_mtime(&path, mtime);
            let f = ReloadingFile::load(vec![path.clone()], compare, number).unwrap();
            // Same stamp: not looked at, whatever the content.
            std::fs::write(&path, "2").unwrap();
            set_mtime(&path, mtime);
            assert!(matches!(reload(&f), Reload::Unchanged), "{compare:?}");
            set_mtime(&path, mtime + std::time::Duration::from_secs(5));
            assert!(matches!(reload(&f), Reload::Replaced), "{compare:?}");
            assert_eq!(*f.current(), 2);
        }
        // Only the length tells this rewrite (same time stamp) under ModifiedAndLength.
        std::fs::write(&path, "1").unwrap();
        set_mtime(&path, mtime);
        let f = ReloadingFile::load(vec![path.clone()], Compare::ModifiedAndLength, number).unwrap();
        std::fs::write(&path, "22").unwrap();
        set_mtime(&path, mtime);
        assert!(matches!(reload(&f), Reload::Replaced));
    }

    #[test]
    fn the_loader_sees_the_value_in_force_and_a_fixed_value_never_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let f = ReloadingFile::load(vec![path.clone()], Compare::Content, number).unwrap();
        std::fs::write(&path, "5").unwrap();
        assert!(matches!(f.reload_if_changed(|c, old| number(c).map(|n| n + old)), Reload::Replaced));
        assert_eq!(*f.current(), 6);
        let fixed = ReloadingFile::fixed(7u32);
        assert!(matches!(reload(&fixed), Reload::Unchanged) && fixed.paths().is_empty());
        assert_eq!(*fixed.current(), 7);
    }
}
