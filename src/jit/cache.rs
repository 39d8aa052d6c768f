//! On-disk cubin cache. Key: SHA-256 of (format version, NVRTC version, options, headers, source).
//! Entries carry a checksum of their payload, so a torn or corrupted file is detected and rebuilt;
//! writes go to a unique temporary file that is renamed into place, so concurrent processes never
//! see a partial entry.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"FCCUBIN1";

/// The cache folder: `$FLASHCORE_CACHE_DIR`, else `$XDG_CACHE_HOME/flashcore`, else
/// `~/.cache/flashcore`, else a folder under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FLASHCORE_CACHE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("flashcore");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(h).join(".cache/flashcore");
    }
    std::env::temp_dir().join("flashcore-cache")
}

/// Hex key naming one compilation.
pub fn key(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

fn entry_path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.cubin"))
}

/// Reads an entry; `None` when absent or corrupt (a corrupt one is removed).
pub fn load(dir: &Path, key: &str) -> Option<Vec<u8>> {
    let path = entry_path(dir, key);
    let bytes = std::fs::read(&path).ok()?;
    match decode(&bytes) {
        Some(payload) => Some(payload.to_vec()),
        None => {
            let _ = std::fs::remove_file(&path);
            None
        }
    }
}

/// Writes an entry atomically (temp file + rename).
pub fn store(dir: &Path, key: &str, payload: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let tmp = dir.join(format!(".{key}.{}.{}.tmp", std::process::id(), unique()));
    std::fs::write(&tmp, encode(payload)).map_err(|e| Error::io(&tmp, e))?;
    let dest = entry_path(dir, key);
    std::fs::rename(&tmp, &dest).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(&dest, e)
    })
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 48)
}

fn encode(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 48);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&Sha256::digest(payload));
    out.extend_from_slice(payload);
    out
}

fn decode(bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() < 48 || &bytes[..8] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().ok()?) as usize;
    let payload = &bytes[48..];
    if payload.len() != len || Sha256::digest(payload).as_slice() != &bytes[16..48] {
        return None;
    }
    Some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption_detected() {
        let dir = tempfile::tempdir().unwrap();
        let k = key(&[b"src", b"opts"]);
        assert!(load(dir.path(), &k).is_none());
        store(dir.path(), &k, b"hello cubin").unwrap();
        assert_eq!(load(dir.path(), &k).unwrap(), b"hello cubin");
        // Flip one payload byte: the entry must be rejected and removed.
        let p = entry_path(dir.path(), &k);
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&p, &bytes).unwrap();
        assert!(load(dir.path(), &k).is_none());
        assert!(!p.exists());
        // Truncated entry is rejected too.
        store(dir.path(), &k, b"hello cubin").unwrap();
        std::fs::write(&p, &std::fs::read(&p).unwrap()[..20]).unwrap();
        assert!(load(dir.path(), &k).is_none());
    }

    #[test]
    fn key_depends_on_every_part() {
        assert_ne!(key(&[b"a", b"b"]), key(&[b"a", b"c"]));
        assert_ne!(key(&[b"ab", b""]), key(&[b"a", b"b"]));
    }

    #[test]
    fn concurrent_writers_leave_a_valid_entry() {
        let dir = tempfile::tempdir().unwrap();
        let k = key(&[b"x"]);
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let d = dir.path();
                let k = &k;
                s.spawn(move || store(d, k, &[i; 4096]).unwrap());
            }
        });
        let got = load(dir.path(), &k).unwrap();
        assert_eq!(got.len(), 4096);
        assert!(got.iter().all(|&b| b == got[0]));
        let leftovers = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count();
        assert_eq!(leftovers, 0);
    }
}
