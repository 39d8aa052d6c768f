//! Prints one line per shipped kernel variant, forward and backward: its name and the SHA-256 of
//! its cubin, sorted by name. Compiles with NVRTC (no GPU). Used by `scripts/cubin-hashes.sh` to
//! show that a host-side change leaves every kernel byte-identical.
//!
//! `CUBIN_HASH_OPTIONS=1` prints the hash of each variant's compile inputs (options, source,
//! headers) instead, without compiling: equal inputs give equal cubins under one NVRTC.
//!
//! `FLASHCORE_CACHE_DIR` decides whether cubins come from the on-disk cache or a fresh compile;
//! the script points it at an empty folder so every cubin is compiled afresh.

use sha2::{Digest, Sha256};
use std::sync::Mutex;

type Job = (
    String,
    Box<dyn Fn() -> flashcore::Result<String> + Send + Sync>,
);

fn main() {
    let inputs_only = std::env::var_os("CUBIN_HASH_OPTIONS").is_some_and(|v| v == "1");
    let cubin_hash = |c: Vec<u8>| hex::encode(Sha256::digest(&c));
    let mut jobs: Vec<Job> = Vec::new();
    for v in flashcore::kernels::shipped_variants() {
        jobs.push((
            v.name(),
            Box::new(move || match inputs_only {
                true => Ok(v.inputs_key()),
                false => v.cubin().map(cubin_hash),
            }),
        ));
    }
    for v in flashcore::kernels::backward::shipped_bwd_variants() {
        jobs.push((
            v.name(),
            Box::new(move || match inputs_only {
                true => Ok(v.inputs_key()),
                false => v.cubin().map(cubin_hash),
            }),
        ));
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
                    Ok(hash) => lines.lock().unwrap().push(format!("{name} {hash}")),
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
