//! Where the CUDA compile tools live: `$CUDA_HOME`, `/usr/local/cuda`, or the project-local
//! install of the pinned PyPI wheels (`scripts/install-cuda-tools.sh` → `.cuda-tools/`).

use crate::error::{Error, Result};
use std::path::PathBuf;

/// Roots that may hold a CUDA toolkit layout (`bin/`, `lib64/` or `lib/`), most specific first.
pub fn toolkit_roots() -> Vec<PathBuf> {
    let mut roots = Vec::new();
    for var in ["FLASHCORE_CUDA_TOOLS", "CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            if !v.is_empty() {
                roots.push(PathBuf::from(v));
            }
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    for dir in project_local_dirs() {
        roots.push(dir.join("nvidia/cu13"));
    }
    roots
}

/// `.cuda-tools/` folders: beside the crate that was built, and above the working directory
/// and the running executable (so carried binaries find a carried install too).
fn project_local_dirs() -> Vec<PathBuf> {
    let mut starts = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR"))];
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            starts.push(dir.to_path_buf());
        }
    }
    let mut out = Vec::new();
    for start in starts {
        for dir in start.ancestors() {
            let candidate = dir.join(".cuda-tools");
            if candidate.is_dir() && !out.contains(&candidate) {
                out.push(candidate);
            }
        }
    }
    out
}

/// First existing file among `root/{sub}/{name}` for every root and sub-folder.
fn find_in_roots(subs: &[&str], names: &[&str]) -> Option<PathBuf> {
    for root in toolkit_roots() {
        for sub in subs {
            for name in names {
                let p = root.join(sub).join(name);
                if p.is_file() {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// Path of the NVRTC shared library.
pub fn nvrtc_library() -> Result<PathBuf> {
    find_in_roots(
        &["lib64", "lib", "targets/x86_64-linux/lib"],
        &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    )
    .ok_or_else(|| {
        let searched: Vec<String> = toolkit_roots()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        Error::NoNvrtc(format!("searched {}", searched.join(", ")))
    })
}

/// Path of a CUDA binary tool such as `nvdisasm` or `cuobjdump`.
pub fn tool(name: &'static str) -> Result<PathBuf> {
    if let Some(p) = find_in_roots(&["bin"], &[name]) {
        return Ok(p);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join(name);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(Error::ToolMissing {
        tool: name,
        hint: "install it with `bash scripts/install-cuda-tools.sh` (pinned PyPI wheels into .cuda-tools/) or set CUDA_HOME to a CUDA 13 toolkit".into(),
    })
}

/// The toolkit's header folders, as nvcc would search them: `include/` and (CUDA 13's CCCL
/// layout) `include/cccl/` of the first toolkit root whose `include/` holds `cuda_fp16.h`
/// (`$CUDA_HOME`, `/usr/local/cuda`, or the PyPI runtime and CCCL wheels in `.cuda-tools/`).
/// Headers are taken from one root only, so they never mix toolkit versions. Empty when no
/// root has them; the caller says where it looked ([`toolkit_roots`]).
pub fn include_dirs() -> Vec<PathBuf> {
    for root in toolkit_roots() {
        let inc = root.join("include");
        if inc.join("cuda_fp16.h").is_file() {
            let mut dirs = vec![inc.clone()];
            let cccl = inc.join("cccl");
            if cccl.is_dir() {
                dirs.push(cccl);
            }
            return dirs;
        }
    }
    Vec::new()
}
