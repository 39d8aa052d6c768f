//! Writing a user's files safely: every output goes to a temporary file in the same directory
//! and is renamed over the destination only once complete, so a crash or a full disk never
//! leaves a torn file or destroys the one that was there. And an output that *is* an input
//! (the same file, also through a symbolic or hard link) is refused before anything is written.

use crate::error::{Error, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory a file at `path` lives in (`.` for a bare file name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, flushed to disk, then
/// renamed over `path`. On any error the destination is untouched and the temporary removed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |tmp| {
        std::fs::write(tmp, bytes).map_err(|e| Error::io(path, e))
    })
}

/// As [`write_atomic`], for writers that need a path (e.g. an image encoder that picks its
/// format by extension): `write` fills the temporary path, which keeps `path`'s extension.
pub fn write_atomic_with(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let dir = parent_dir(path);
    let suffix = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let tmp = tempfile::Builder::new()
        .prefix(".flashcore-tmp-")
        .suffix(&suffix)
        .tempfile_in(&dir)
        .map_err(|e| Error::io(path, e))?;
    write(tmp.path())?;
    // Flush the data before the rename makes it visible under the final name.
    std::fs::OpenOptions::new()
        .append(true)
        .open(tmp.path())
        .and_then(|mut f| f.flush().and_then(|_| f.sync_all()))
        .map_err(|e| Error::io(path, e))?;
    // A temporary file is created owner-only (0600); the result gets the permissions of the file
    // it replaces, or the usual 0644 for a new one.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let perms = std::fs::metadata(path)
            .map(|m| m.permissions())
            .unwrap_or_else(|_| std::fs::Permissions::from_mode(0o644));
        std::fs::set_permissions(tmp.path(), perms).map_err(|e| Error::io(path, e))?;
    }
    tmp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// True when `a` and `b` name the same existing file: same canonical path, or (Unix) the same
/// device and inode, which also catches hard links.
pub fn same_file(a: &Path, b: &Path) -> bool {
    let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if (ma.dev(), ma.ino()) == (mb.dev(), mb.ino()) {
            return true;
        }
    }
    let _ = (ma, mb);
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Refuses an output path that is one of the inputs (it would be destroyed by the write).
pub fn check_not_an_input(output: &Path, inputs: &[&Path]) -> Result<()> {
    for input in inputs {
        if same_file(output, input) {
            return Err(Error::invalid(
                "output",
                format!(
                    "{} is the input file {} (writing it would destroy the input): choose another path",
                    output.display(),
                    input.display()
                ),
            ));
        }
    }
    Ok(())
}
