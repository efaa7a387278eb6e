//! The file-write layer of the bus, with the storage fault hook.
//!
//! Every byte the bus writes to disk (segments, index files, the cursor store, the
//! readiness probe) goes through [`Storage`], so an injected fault takes exactly the path
//! a real failed write takes: a partial write followed by ENOSPC.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shared disk-write gate: normally open, failing with ENOSPC while a fault is injected.
#[derive(Default)]
pub(crate) struct Storage {
    fail_until: Mutex<Option<Instant>>,
    /// Full while the switch is on (the simulation's hub restarted into a full disk).
    disk_full: DiskFull,
    /// Tests: the bytes a disk that is nearly full still takes per write; a larger write
    /// writes what fits, then fails with ENOSPC.
    free: Mutex<Option<usize>>,
}

/// `ENOSPC`: what an injected fault reports, as a full disk would.
const ENOSPC: i32 = 28;

impl Storage {
    /// A gate whose disk is full while `disk_full` is on.
    pub(crate) fn with_disk(disk_full: DiskFull) -> Self {
        Self { disk_full, ..Self::default() }
    }

    /// Makes every write fail with ENOSPC for `d` (tests and the chaos soak).
    pub(crate) fn fail_for(&self, d: Duration) {
        if let Ok(mut until) = self.fail_until.lock() {
            *until = Some(Instant::now() + d);
        }
    }

    /// Tests: writes larger than `bytes` fail with ENOSPC (after writing what fits), as
    /// on a disk with only that much space left; `None` lifts it.
    #[cfg(test)]
    pub(crate) fn set_free(&self, bytes: Option<usize>) {
        if let Ok(mut free) = self.free.lock() {
            *free = bytes;
        }
    }

    /// How much of a write of `len` bytes fits, when not all of it does.
    fn fits(&self, len: usize) -> Option<usize> {
        self.free.lock().ok().and_then(|f| *f).filter(|free| len > *free)
    }

    /// `Err(ENOSPC)` while a fault is injected: every write and sync passes this gate.
    pub(crate) fn check(&self) -> std::io::Result<()> {
        let failing = self.disk_full.is_full()
            || self.fail_until.lock().map(|u| u.is_some_and(|t| Instant::now() < t)).unwrap_or(false);
        if failing { Err(std::io::Error::from_raw_os_error(ENOSPC)) } else { Ok(()) }
    }

    /// Writes all of `buf`. Under an injected fault, half of it is written first: a real
    /// full disk also leaves a partial write behind, which the caller must cut.
    pub(crate) fn write_all(&self, file: &mut File, buf: &[u8]) -> std::io::Result<()> {
        if let Err(e) = self.check() {
            let _ = file.write_all(&buf[..buf.len() / 2]);
            return Err(e);
        }
        if let Some(free) = self.fits(buf.len()) {
            let _ = file.write_all(&buf[..free]);
            return Err(std::io::Error::from_raw_os_error(ENOSPC));
        }
        file.write_all(buf)
    }

    /// Writes all of `buf` at `offset` (in place). Under an injected fault, half of it is
    /// written first, as [`Storage::write_all`] does.
    pub(crate) fn write_at(&self, file: &File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        if let Err(e) = self.check() {
            let _ = file.write_all_at(&buf[..buf.len() / 2], offset);
            return Err(e);
        }
        if let Some(free) = self.fits(buf.len()) {
            let _ = file.write_all_at(&buf[..free], offset);
            return Err(std::io::Error::from_raw_os_error(ENOSPC));
        }
        file.write_all_at(buf, offset)
    }

    /// Opens (creating it) a file written in place ([`Storage::write_at`]).
    pub(crate) fn open_mark(&self, path: &Path) -> std::io::Result<File> {
        self.check()?;
        std::fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)
    }

    /// `fdatasync`.
    pub(crate) fn sync(&self, file: &File) -> std::io::Result<()> {
        self.check()?;
        file.sync_data()
    }

    /// Opens (creating it) a segment for appending: after a cut, writes go to the new end.
    pub(crate) fn open_segment(&self, path: &Path) -> std::io::Result<File> {
        self.check()?;
        std::fs::OpenOptions::new().create(true).append(true).open(path)
    }

    /// Creates (or truncates) `path` for writing.
    pub(crate) fn create(&self, path: &Path) -> std::io::Result<File> {
        self.check()?;
        File::create(path)
    }

    /// Writes `bytes` to `path` atomically and durably: temporary file, fsync, rename,
    /// fsync of the directory.
    pub(crate) fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), StorageError> {
        let tmp = path.with_extension("tmp");
        let err = |p: &Path| {
            let p = p.to_path_buf();
            move |e| StorageError::new(&p, e)
        };
        let mut f = self.create(&tmp).map_err(err(&tmp))?;
        let written = self.write_all(&mut f, bytes).and_then(|()| self.sync(&f));
        if let Err(e) = written {
            drop(f);
            let _ = std::fs::remove_file(&tmp);
            return Err(StorageError::new(&tmp, e));
        }
        std::fs::rename(&tmp, path).map_err(err(path))?;
        if let Some(dir) = path.parent() {
            File::open(dir).and_then(|d| d.sync_all()).map_err(err(dir))?;
        }
        Ok(())
    }

    /// Checks that the directory takes a durable write of `bytes` (at least 4 KiB): after
    /// a failure, as large as the write that failed, so readiness is not claimed on the
    /// strength of a write smaller than every real one.
    pub(crate) fn probe(&self, dir: &Path, bytes: u64) -> Result<(), StorageError> {
        let path = dir.join("write-probe");
        let len = usize::try_from(bytes).unwrap_or(usize::MAX).max(4096);
        let result = self.write_atomic(&path, &vec![0u8; len]);
        let _ = std::fs::remove_file(&path);
        result
    }
}

/// A switch that fills the segment log's disk: while it is on, every write and sync fails
/// with ENOSPC through the path a real full disk takes. For the deterministic simulation
/// (a hub restarted into a full disk, emptied at a simulated time) and tests; a
/// production bus never turns it on.
///
/// ```
/// let full = fleetwatch_bus::DiskFull::default();
/// full.set(true);
/// assert!(full.is_full());
/// ```
#[derive(Debug, Clone, Default)]
pub struct DiskFull(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl DiskFull {
    /// Fills the disk (`true`) or frees it.
    pub fn set(&self, full: bool) {
        self.0.store(full, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the disk is full now.
    pub fn is_full(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A failed disk operation: the cause and the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{cause} ({})", path.display())]
pub struct StorageError {
    /// The file.
    pub path: PathBuf,
    /// What the OS said, e.g. "no space left on device".
    pub cause: String,
    /// Whether the cause lasts until someone acts (the directory may not be written, is
    /// on a read-only file system, is not a directory): a hub does not start on it. A full
    /// disk or an I/O error may pass.
    pub lasting: bool,
}

impl StorageError {
    pub(crate) fn new(path: &Path, e: std::io::Error) -> Self {
        use std::io::ErrorKind::*;
        let lasting = matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem | NotADirectory | IsADirectory);
        Self { path: path.to_path_buf(), cause: cause(&e), lasting }
    }
}

/// An I/O error's text once, without the " (os error N)" suffix and with a lower-case
/// start, so it reads well inside a sentence: "no space left on device".
pub(crate) fn cause(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match (e.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(i)) => text[..i].to_string(),
        _ => text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cause_is_said_once_in_lower_case() {
        assert_eq!(cause(&std::io::Error::from_raw_os_error(28)), "no space left on device");
        let e = StorageError::new(Path::new("/d/segments/1.log"), std::io::Error::from_raw_os_error(13));
        assert_eq!(e.to_string(), "permission denied (/d/segments/1.log)");
    }

    #[test]
    fn injected_fault_fails_writes_then_clears() {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::default();
        s.fail_for(Duration::from_secs(3600));
        let err = s.write_atomic(&dir.path().join("x"), b"abc").unwrap_err();
        assert_eq!(err.cause, "no space left on device");
        s.fail_for(Duration::ZERO);
        s.write_atomic(&dir.path().join("x"), b"abc").unwrap();
        assert_eq!(std::fs::read(dir.path().join("x")).unwrap(), b"abc");
    }
}
