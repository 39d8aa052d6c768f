//! Run-time compilation of the CUDA kernels: NVRTC to an sm_90a cubin, cached on disk.

pub mod cache;
pub mod nvrtc;
pub mod toolkit;

pub use nvrtc::Header;

use crate::error::Result;

/// The one target architecture: Hopper with its arch-specific features (wgmma, setmaxnreg).
pub const ARCH: &str = "sm_90a";

/// NVRTC options every flashcore kernel (and every `audit --source` file) is compiled with.
/// No fast-math flags: IEEE `/` and `sqrt` stay IEEE, so the audit sees any that slip in;
/// kernels call the approximate instructions explicitly where they want them.
pub fn base_options() -> Vec<String> {
    vec![
        format!("--gpu-architecture={ARCH}"),
        "--std=c++17".into(),
        "--device-as-default-execution-space".into(),
        "--fmad=true".into(),
    ]
}

/// A hash of everything a compile reads besides the compiler: options, source and headers. Under
/// one NVRTC, equal keys give byte-identical cubins (`scripts/cubin-hashes.sh`'s fast mode).
pub fn inputs_key(source: &str, headers: &[Header<'_>], options: &[String]) -> String {
    let opts = options.join("\u{1f}");
    let mut parts: Vec<&[u8]> = vec![b"flashcore-inputs-v1", opts.as_bytes(), source.as_bytes()];
    for h in headers {
        parts.push(h.name.as_bytes());
        parts.push(h.source.as_bytes());
    }
    cache::key(&parts)
}

/// Compiles through the on-disk cache. The key covers source, headers, options, architecture and
/// the NVRTC version, so any change to any of them compiles afresh.
pub fn compile_cached(
    kernel: &str,
    source: &str,
    headers: &[Header<'_>],
    options: &[String],
) -> Result<Vec<u8>> {
    let (major, minor) = nvrtc::ensure_loaded()?;
    let version = format!("nvrtc {major}.{minor} {ARCH}");
    let opts = options.join("\u{1f}");
    let mut parts: Vec<&[u8]> = vec![
        b"flashcore-cubin-v1",
        version.as_bytes(),
        opts.as_bytes(),
        source.as_bytes(),
    ];
    for h in headers {
        parts.push(h.name.as_bytes());
        parts.push(h.source.as_bytes());
    }
    let key = cache::key(&parts);
    let dir = cache::cache_dir();
    if let Some(cubin) = cache::load(&dir, &key) {
        return Ok(cubin);
    }
    let cubin = nvrtc::compile(kernel, source, headers, options)?;
    // A cache we cannot write (read-only home, full disk) costs speed, not correctness.
    if let Err(e) = cache::store(&dir, &key, &cubin) {
        eprintln!("flashcore: warning: cannot write kernel cache: {e}");
    }
    Ok(cubin)
}
