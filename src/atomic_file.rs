//! Files replaced atomically: the content goes to a hidden sibling of the target, is synced to
//! disk, then renamed over the target. A crash, a kill or a full disk while writing never
//! leaves a half-written file under the target's name (the old file, if any, stays whole).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Writes `path` through `fill`, atomically (see the [module docs](self)).
pub fn write_atomically(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> Result<()>) -> Result<()> {
    let tmp = temp_path(path)?;
    let result = (|| {
        let file = File::create(&tmp).map_err(|e| write_err(path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        fill(&mut out)?;
        let file = out.into_inner().map_err(|e| write_err(path, e.into_error()))?;
        file.sync_all().map_err(|e| write_err(path, e))?;
        std::fs::rename(&tmp, path).map_err(|e| write_err(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The error for a failed write to `path`.
pub fn write_err(path: &Path, source: std::io::Error) -> Error {
    Error::Write { path: path.to_path_buf(), source }
}

/// A hidden sibling of `path` in the same directory, so the final rename is atomic.
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::invalid_argument("path", format!("'{}' is not a file path", path.display())))?;
    // Unique per process and per call, so concurrent writes never share a temporary file.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
    Ok(path.with_file_name(tmp_name))
}
