//! When to look at followed files again ([`FileChecks`]): at once (after a short settle)
//! when the directory holding them reports a change, through inotify (the `notify` crate),
//! and otherwise only on a slow fallback period, so that a client following its
//! certificate files does not read them every few seconds for nothing.
//!
//! The directory is watched, not the file: a kubelet updates a mounted Secret by writing a
//! fresh directory and swapping the `..data` symlink in one rename, which a watch on the old
//! file would never see. A path that is itself a symlink has the directory of what it points
//! to watched too. What a check then finds is still [`crate::ReloadingFile`]'s to decide
//! (by content, the last good value kept, a failure said once); a notice only says *when*.
//!
//! One inotify instance (one thread) serves the whole process, whatever the number of
//! followers: the hub bench runs 10,000 agents in one process, all following files in one
//! directory, and each directory is watched once, with a count of its followers. Where
//! inotify cannot be had (no instance left, a file system without it, a directory missing)
//! the fallback period is all there is, said once per directory; so it is for events the
//! kernel's queue dropped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::watch;
use tokio::time::Instant;

/// How long a check waits after the last change seen before it reads the files: a writer
/// is usually done by then (a certificate, then its key; a kubelet's renames), so a
/// half-written file is rarely read (and when it is, it is one failure said once, and the
/// writer's next change brings another check).
pub const SETTLE: Duration = Duration::from_millis(100);

/// The longest a check waits after the first change it saw, however many follow.
pub const SETTLE_AT_MOST: Duration = Duration::from_secs(1);

/// The fallback period clients use by default: a change the watch missed (inotify
/// unavailable, a network file system) is still seen within it.
pub const DEFAULT_FALLBACK: Duration = Duration::from_secs(60);

/// Says when followed files are worth checking (see the module documentation). Cancel-safe
/// to wait on in a `select!`: what a cancelled wait saw is kept.
pub struct FileChecks {
    watched: Vec<Watched>,
    fallback: Duration,
    next_poll: Instant,
    /// A change was seen: the check is due at `due` (first seen at `first`).
    pending: Option<Pending>,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    first: Instant,
    due: Instant,
}

impl std::fmt::Debug for FileChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileChecks")
            .field("dirs", &self.watched.iter().map(|w| (&w.dir, w.rx.is_some())).collect::<Vec<_>>())
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

impl FileChecks {
    /// Follows `paths` by watching their directories (falling back to reading them every
    /// `fallback` where a directory cannot be watched), with `fallback` between checks
    /// when nothing is reported either way.
    pub fn watching(paths: &[PathBuf], fallback: Duration) -> Self {
        let watched = dirs_of(paths).into_iter().map(|dir| registry().acquire(dir)).collect();
        Self { watched, fallback, next_poll: Instant::now() + fallback, pending: None }
    }

    /// Checks every `fallback` only, watching nothing (a deterministic simulation, a file
    /// system where watching misleads).
    pub fn polling(fallback: Duration) -> Self {
        Self { watched: Vec::new(), fallback, next_poll: Instant::now() + fallback, pending: None }
    }

    /// [`watching`](Self::watching) when `watch` is set, else [`polling`](Self::polling).
    pub fn new(paths: &[PathBuf], fallback: Duration, watch: bool) -> Self {
        if watch { Self::watching(paths, fallback) } else { Self::polling(fallback) }
    }

    /// Whether every directory of the files is watched (changes are then seen at once).
    pub fn is_watching(&self) -> bool {
        !self.watched.is_empty() && self.watched.iter().all(|w| w.rx.is_some())
    }

    /// The fallback period.
    pub fn fallback(&self) -> Duration {
        self.fallback
    }

    /// When the next check is due: a change seen, once it settled, or the fallback period
    /// after the last check. Takes note of changes reported meanwhile.
    pub fn deadline(&mut self) -> Instant {
        let mut seen = false;
        for w in &mut self.watched {
            if let Some(rx) = &mut w.rx
                && rx.has_changed().unwrap_or(false)
            {
                rx.borrow_and_update();
                seen = true;
            }
        }
        if seen {
            self.note(Instant::now());
        }
        self.pending.map_or(self.next_poll, |p| p.due.min(self.next_poll))
    }

    /// Whether a check is due now.
    pub fn is_due(&mut self) -> bool {
        self.deadline() <= Instant::now()
    }

    /// Waits for the next change reported by the watch and takes note of it (the check is
    /// then due after [`SETTLE`]); never returns without a watch. Cancel-safe. For a loop
    /// that keeps one timer of its own for [`deadline`](Self::deadline).
    pub async fn changed(&mut self) {
        let lost = {
            let mut rxs: Vec<(usize, &mut watch::Receiver<u64>)> =
                self.watched.iter_mut().enumerate().filter_map(|(i, w)| w.rx.as_mut().map(|rx| (i, rx))).collect();
            match rxs.len() {
                0 => std::future::pending().await,
                1 => {
                    let (i, rx) = rxs.pop().expect("one receiver");
                    rx.changed().await.is_err().then_some(i)
                }
                _ => {
                    let futs = rxs.into_iter().map(|(i, rx)| Box::pin(async move { (i, rx.changed().await) }));
                    let ((i, r), _, _) = futures_util::future::select_all(futs).await;
                    r.is_err().then_some(i)
                }
            }
        };
        match lost {
            // The registry holds the sender while anyone follows the directory: not expected,
            // but then this directory is polled only.
            Some(i) => self.watched[i].rx = None,
            None => {
                for rx in self.watched.iter_mut().filter_map(|w| w.rx.as_mut()) {
                    rx.borrow_and_update();
                }
                self.note(Instant::now());
            }
        }
    }

    /// Waits until a check is due (see [`deadline`](Self::deadline)). Cancel-safe.
    pub async fn due(&mut self) {
        loop {
            let at = self.deadline();
            tokio::select! {
                _ = tokio::time::sleep_until(at) => return,
                _ = self.changed() => {}
            }
        }
    }

    /// A check was made now: what was reported before it is seen, and the next fallback
    /// check is a period away.
    pub fn checked(&mut self) {
        for rx in self.watched.iter_mut().filter_map(|w| w.rx.as_mut()) {
            rx.borrow_and_update();
        }
        self.pending = None;
        self.next_poll = Instant::now() + self.fallback;
    }

    fn note(&mut self, now: Instant) {
        self.pending = Some(match self.pending {
            None => Pending { first: now, due: now + SETTLE },
            Some(p) => Pending { first: p.first, due: (now + SETTLE).min(p.first + SETTLE_AT_MOST) },
        });
    }
}

/// The directories to watch for `paths`, made absolute (inotify reports absolute paths),
/// without repeats: each one's parent; the parent of every symlink on its way (a directory
/// link swapped to a new version is replaced in the directory above it, where a watch on the
/// file's own directory, which follows the old link, never sees it); and the parent of what
/// it finally points to.
fn dirs_of(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut add = |file: &Path| {
        if let Some(dir) = file.parent().map(Path::to_path_buf)
            && !dirs.contains(&dir)
        {
            dirs.push(dir);
        }
    };
    for path in paths {
        let own = std::path::absolute(path).unwrap_or_else(|_| path.clone());
        add(&own);
        for link in own.ancestors().skip(1).filter(|a| a.symlink_metadata().is_ok_and(|m| m.is_symlink())) {
            add(link);
        }
        if let Ok(target) = std::fs::canonicalize(path) {
            add(&target);
        }
    }
    dirs
}

/// One follower's registration of a directory: its notices, if the directory is watched.
struct Watched {
    dir: PathBuf,
    rx: Option<watch::Receiver<u64>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        registry().release(&self.dir);
    }
}

/// The process's one watcher and the directories it watches.
struct Registry {
    /// `None` when inotify could not be had (said once).
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    /// Shared with the watcher's event handler, which takes only this lock (never while the
    /// watcher's is held for it: adding a watch waits for the watcher's thread).
    dirs: Arc<Mutex<HashMap<PathBuf, Dir>>>,
}

struct Dir {
    /// Bumped at every change reported in the directory.
    tx: watch::Sender<u64>,
    /// Followers.
    refs: usize,
    /// Whether inotify watches it.
    watched: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let dirs: Arc<Mutex<HashMap<PathBuf, Dir>>> = Arc::default();
        let notices = dirs.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // An error or a rescan (the kernel's queue overflowed: events were lost) is left
            // to the fallback period. Taking it for a change of everything would have every
            // follower read its files at once, and in a process with thousands of them
            // (the hub bench's load) those reads' own events overflow the queue again.
            let event = match event {
                Ok(e) if !e.need_rescan() => e,
                Ok(_) | Err(_) => {
                    tracing::debug!("file watch events were lost; the fallback period covers them");
                    return;
                }
            };
            if !is_change(&event.kind) {
                return;
            }
            for (dir, d) in lock(&notices).iter() {
                if event.paths.iter().any(|p| p == dir || p.parent() == Some(dir.as_path())) {
                    d.tx.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch files for changes (inotify); followed files are read on their fallback period only");
                None
            }
        };
        Registry { watcher: Mutex::new(watcher), dirs }
    })
}

/// Whether an event can mean new content: anything but reading (opening, reading and
/// closing unwritten, which every check itself causes).
fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

impl Registry {
    fn acquire(&self, dir: PathBuf) -> Watched {
        let mut watcher = lock(&self.watcher);
        if let Some(d) = lock(&self.dirs).get_mut(&dir) {
            d.refs += 1;
            let rx = d.watched.then(|| d.tx.subscribe());
            return Watched { dir, rx };
        }
        let (tx, _) = watch::channel(0u64);
        let rx = tx.subscribe();
        lock(&self.dirs).insert(dir.clone(), Dir { tx, refs: 1, watched: false });
        let result = match watcher.as_mut() {
            Some(w) => w.watch(&dir, RecursiveMode::NonRecursive).map_err(|e| e.to_string()),
            None => Err("inotify is not available".to_string()),
        };
        match result {
            Ok(()) => {
                if let Some(d) = lock(&self.dirs).get_mut(&dir) {
                    d.watched = true;
                }
                Watched { dir, rx: Some(rx) }
            }
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch this directory for changes of followed files; they are read on their fallback period only");
                Watched { dir, rx: None }
            }
        }
    }

    fn release(&self, dir: &Path) {
        let mut watcher = lock(&self.watcher);
        let unwatch = {
            let mut dirs = lock(&self.dirs);
            let Some(d) = dirs.get_mut(dir) else { return };
            d.refs -= 1;
            if d.refs > 0 {
                return;
            }
            dirs.remove(dir).is_some_and(|d| d.watched)
        };
        if unwatch && let Some(w) = watcher.as_mut() {
            // A directory removed meanwhile is no longer watched anyway.
            let _ = w.unwatch(dir);
        }
    }

    #[cfg(test)]
    fn followers(&self, dir: &Path) -> usize {
        lock(&self.dirs).get(dir).map_or(0, |d| d.refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Compare, Reload, ReloadingFile};

    /// Waits for `cond` (a watcher's notice comes from its own thread, in real time).
    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(30), async {
            while !cond() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "{what} did not happen");
    }

    fn number(f: &ReloadingFile<u32>) -> Reload<String> {
        f.reload_if_changed(|mut c, _| {
            let bytes = c.take(0).map_err(|e| e.to_string())?;
            String::from_utf8_lossy(&bytes).trim().parse::<u32>().map_err(|e| e.to_string())
        })
    }

    fn load(path: &Path) -> ReloadingFile<u32> {
        ReloadingFile::load(vec![path.to_path_buf()], Compare::Content, |mut c| {
            String::from_utf8_lossy(&c.take(0).unwrap()).trim().parse::<u32>().map_err(|e| e.to_string())
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_change_is_seen_through_the_watch_long_before_the_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let f = load(&path);
        let mut checks = FileChecks::watching(f.paths(), Duration::from_secs(3600));
        assert!(checks.is_watching());
        std::fs::write(&path, "2").unwrap();
        // Only the watch can bring the check within the test's patience.
        tokio::time::timeout(Duration::from_secs(60), checks.due()).await.expect("the watch reported the change");
        checks.checked();
        assert!(matches!(number(&f), Reload::Replaced));
        assert_eq!(*f.current(), 2);
        // Reading the files (as every check does) is not a change.
        assert!(matches!(number(&f), Reload::Unchanged));
        assert!(!checks.is_due());
    }

    #[tokio::test]
    async fn a_kubelet_style_symlink_swap_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("..1")).unwrap();
        std::fs::write(d.join("..1/n"), "1").unwrap();
        std::os::unix::fs::symlink("..1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/n", d.join("n")).unwrap();
        let f = load(&d.join("n"));
        let mut checks = FileChecks::watching(f.paths(), Duration::from_secs(3600));
        // The new content in a fresh directory, then the `..data` link swapped in one rename.
        std::fs::create_dir(d.join("..2")).unwrap();
        std::fs::write(d.join("..2/n"), "2").unwrap();
        std::os::unix::fs::symlink("..2", d.join("..data_tmp")).unwrap();
        std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
        std::fs::remove_dir_all(d.join("..1")).unwrap();
        tokio::time::timeout(Duration::from_secs(60), checks.due()).await.expect("the swap was reported");
        checks.checked();
        assert!(matches!(number(&f), Reload::Replaced));
        assert_eq!(*f.current(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_watch_the_fallback_period_brings_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let f = load(&path);
        let mut checks = FileChecks::polling(Duration::from_secs(60));
        assert!(!checks.is_watching());
        std::fs::write(&path, "2").unwrap();
        let start = Instant::now();
        checks.due().await;
        assert_eq!(start.elapsed(), Duration::from_secs(60), "due exactly one fallback period after the last check");
        checks.checked();
        assert!(matches!(number(&f), Reload::Replaced));
        // Then one period after that check.
        let start = Instant::now();
        checks.due().await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_directory_with_no_change_is_checked_on_the_fallback_period_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let mut checks = FileChecks::watching(&[path], Duration::from_secs(60));
        assert!(checks.is_watching());
        let start = Instant::now();
        checks.due().await;
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn changes_settle_before_the_check_but_not_forever() {
        let mut checks = FileChecks::polling(Duration::from_secs(3600));
        let t0 = Instant::now();
        checks.note(t0);
        assert_eq!(checks.deadline(), t0 + SETTLE);
        // Each further change pushes the check back, up to SETTLE_AT_MOST after the first.
        checks.note(t0 + Duration::from_millis(50));
        assert_eq!(checks.deadline(), t0 + Duration::from_millis(50) + SETTLE);
        checks.note(t0 + Duration::from_millis(990));
        assert_eq!(checks.deadline(), t0 + SETTLE_AT_MOST);
        checks.checked();
        assert_eq!(checks.deadline(), Instant::now() + Duration::from_secs(3600));
    }

    #[test]
    fn one_watch_per_directory_for_all_its_followers() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let abs = std::path::absolute(dir.path()).unwrap();
        let first = FileChecks::watching(&[a.clone(), b.clone()], DEFAULT_FALLBACK);
        assert_eq!(first.watched.len(), 1, "two files of one directory: one watch");
        let second = FileChecks::watching(&[a], DEFAULT_FALLBACK);
        assert_eq!(registry().followers(&abs), 2);
        drop(first);
        assert_eq!(registry().followers(&abs), 1);
        drop(second);
        assert_eq!(registry().followers(&abs), 0, "the last follower gone, the directory is no longer watched");
    }

    #[test]
    fn a_symlinked_file_has_the_directory_of_its_target_watched_too() {
        let dir = tempfile::tempdir().unwrap();
        let (mount, store) = (dir.path().join("mount"), dir.path().join("store"));
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::create_dir_all(&store).unwrap();
        std::fs::write(store.join("tls.crt"), "x").unwrap();
        std::os::unix::fs::symlink(store.join("tls.crt"), mount.join("tls.crt")).unwrap();
        let dirs = dirs_of(&[mount.join("tls.crt")]);
        assert_eq!(dirs.len(), 2, "{dirs:?}");
        assert!(dirs[0].ends_with("mount") && dirs[1].ends_with("store"), "{dirs:?}");
        // A directory link on the way (`current` -> a version) has the directory holding
        // it watched: swapping it is an event there.
        std::os::unix::fs::symlink(&store, dir.path().join("current")).unwrap();
        let dirs = dirs_of(&[dir.path().join("current").join("tls.crt")]);
        let abs = std::path::absolute(dir.path()).unwrap();
        assert!(dirs.contains(&abs.join("current")) && dirs.contains(&abs), "{dirs:?}");
    }

    #[tokio::test]
    async fn a_swapped_directory_link_is_seen() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (v, n) in [("v1", "1"), ("v2", "2")] {
            std::fs::create_dir(d.join(v)).unwrap();
            std::fs::write(d.join(v).join("n"), n).unwrap();
        }
        std::os::unix::fs::symlink("v1", d.join("current")).unwrap();
        let f = load(&d.join("current").join("n"));
        let mut checks = FileChecks::watching(f.paths(), Duration::from_secs(3600));
        std::os::unix::fs::symlink("v2", d.join("next")).unwrap();
        std::fs::rename(d.join("next"), d.join("current")).unwrap();
        tokio::time::timeout(Duration::from_secs(60), checks.due()).await.expect("the swap was reported");
        checks.checked();
        assert!(matches!(number(&f), Reload::Replaced));
        assert_eq!(*f.current(), 2);
    }

    #[tokio::test]
    async fn reading_the_files_is_not_a_change() {
        assert!(!is_change(&EventKind::Access(AccessKind::Open(AccessMode::Any))));
        assert!(!is_change(&EventKind::Access(AccessKind::Close(AccessMode::Read))));
        assert!(is_change(&EventKind::Access(AccessKind::Close(AccessMode::Write))));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n");
        std::fs::write(&path, "1").unwrap();
        let checks = FileChecks::watching(std::slice::from_ref(&path), Duration::from_secs(3600));
        let rx = checks.watched[0].rx.clone().expect("watched");
        let before = *rx.borrow();
        for _ in 0..20 {
            std::fs::read(&path).unwrap();
        }
        // A file written after the reads: its notices (create, modify, close after writing)
        // come after theirs, in order, so once the write's are in, the reads' would be too.
        std::fs::write(dir.path().join("sentinel"), "x").unwrap();
        wait_until("the write is reported", || *rx.borrow() >= before + 3).await;
        let notices = *rx.borrow() - before;
        assert!(notices < 20, "{notices} notices for 20 reads and one write: reads were taken for changes");
    }
}
