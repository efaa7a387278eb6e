//! The dead-letter file (`--dead-letter DIR`): events a target refused for good (400, 413,
//! 422) are appended to `DIR/<relay>.jsonl`, one JSON line per request with the target, the
//! answer and the request body, and only then acknowledged to the hub. The file is bounded
//! in bytes: when the next line would pass the bound (or cannot be written), the relay does
//! not acknowledge and retries, so the events wait at the hub instead of being dropped; the
//! retries metric and `FleetwatchRelayNotDelivering` say so. Move the file away to go on.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Value, json};

/// Why a line could not be kept.
#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The directory or file cannot be opened or written.
    #[error("dead-letter file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The bound would be passed.
    #[error("dead-letter file {path} is full ({size} of {max} bytes; the next line needs {line}): move it away")]
    Full {
        /// The file.
        path: String,
        /// Its size.
        size: u64,
        /// The bound.
        max: u64,
        /// The line's size.
        line: u64,
    },
}

/// An append-only, byte-bounded dead-letter file.
#[derive(Debug)]
pub struct DeadLetter {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<std::fs::File>,
}

impl DeadLetter {
    /// Opens (creating) `dir/<relay>.jsonl` with a bound of `max_bytes`.
    pub fn open(dir: &Path, relay: &str, max_bytes: u64) -> Result<Self, DeadLetterError> {
        let path = dir.join(format!("{relay}.jsonl"));
        let io = |source| DeadLetterError::Io { path: path.display().to_string(), source };
        std::fs::create_dir_all(dir).map_err(io)?;
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
        Ok(Self { path, max_bytes, file: Mutex::new(file) })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one refused request (and syncs it) or says why not.
    pub fn append(&self, target: &str, status: u16, answer: &str, body: &[u8]) -> Result<(), DeadLetterError> {
        let request: Value =
            serde_json::from_slice(body).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into()));
        let mut line = json!({
            "time": jiff::Timestamp::now().to_string(),
            "target": target,
            "status": status,
            "answer": answer,
            "request": request,
        })
        .to_string();
        line.push('\n');
        let path = self.path.display().to_string();
        let io = |source| DeadLetterError::Io { path: path.clone(), source };
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // The size on disk: the file may have been moved away or truncated meanwhile.
        let size = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        if size + line.len() as u64 > self.max_bytes {
            return Err(DeadLetterError::Full { path, size, max: self.max_bytes, line: line.len() as u64 });
        }
        let mut f = &*file;
        f.write_all(line.as_bytes()).map_err(io)?;
        f.sync_data().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_kept_until_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let dl = DeadLetter::open(dir.path(), "webhook", 400).unwrap();
        dl.append("http://t", 422, "bad field", br#"{"id":"c/1/1"}"#).unwrap();
        let text = std::fs::read_to_string(dl.path()).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!((v["status"].as_u64(), v["request"]["id"].as_str()), (Some(422), Some("c/1/1")));
        let mut full = None;
        for _ in 0..10 {
            if let Err(e) = dl.append("http://t", 400, "x", b"not json") {
                full = Some(e.to_string());
                break;
            }
        }
        let full = full.expect("the bound is reached");
        assert!(full.contains("is full") && full.contains("webhook.jsonl"), "{full}");
        assert!(std::fs::metadata(dl.path()).unwrap().len() <= 400);
    }
}
