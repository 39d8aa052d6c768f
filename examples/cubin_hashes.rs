//! Prints one line per shipped kernel variant, forward and backward: its name and the SHA-256 of
//! its cubin, sorted by name. Compiles with NVRTC (no GPU). Used by `scripts/cubin-hashes.sh` to
//! show that a host-side change leaves every kernel byte-identical.
//!
//! `FLASHCORE_CACHE_DIR` decides whether cubins come from the on-disk cache or a fresh compile;
//! the script points it at an empty folder so every cubin is compiled afresh.

use sha2::{Digest, Sha256};
use std::sync::Mutex;

type Job = (
    String,
    Box<dyn Fn() -> flashcore::Result<Vec<u8>> + Send + Sync>,
);

fn main() {
    let mut jobs: Vec<Job> = Vec::new();
    for v in flashcore::kernels::shipped_variants() {
        jobs.push((v.name(), Box::new(move || v.cubin())));
    }
    for v in flashcore::kernels::backward::shipped_bwd_variants() {
        jobs.push((v.name(), Box::new(move || v.cubin())));
    }
    let threads: usize = std::env::var("CUBIN_HASH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1)
        .max(1);
    let next = Mutex::new(0usize);
    let lines = Mutex::new(Vec::with_capacity(jobs.len()));
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some((name, build)) = jobs.get(i) else {
                    break;
                };
                match build() {
                    Ok(cubin) => lines
                        .lock()
                        .unwrap()
                        .push(format!("{name} {}", hex::encode(Sha256::digest(&cubin)))),
                    Err(e) => failed.lock().unwrap().push(format!("{name}: {e}")),
                }
            });
        }
    });
    let failed = failed.into_inner().unwrap();
    if !failed.is_empty() {
        for f in &failed {
            eprintln!("cubin-hashes: {f}");
        }
        std::process::exit(1);
    }
    let mut lines = lines.into_inner().unwrap();
    lines.sort();
    for l in lines {
        println!("{l}");
    }
}
