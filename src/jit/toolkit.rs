//! Where the CUDA compile tools live: `$CUDA_HOME`, `/usr/local/cuda`, or the project-local
//! install of the pinned PyPI wheels (`scripts/install-cuda-tools.sh` → `.cuda-tools/`).

use crate::error::{Error, Result};
use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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

/// Environment variable that sets the wall-clock limit, in seconds (decimals allowed), on every
/// external tool run ([`run_tool`]).
pub const TOOL_TIMEOUT_ENV: &str = "FLASHCORE_TOOL_TIMEOUT_S";

/// The limit without [`TOOL_TIMEOUT_ENV`] or [`set_tool_timeout`]. `nvdisasm -c -gi` takes
/// at most 0.9 s on a shipped kernel (the largest cubin, 61 KB, on a 2-core machine; all 44
/// take 30 s of `flashcore audit`, mostly the analysis), so two minutes leaves over 100x room
/// for a slow or loaded machine and for users' larger kernels, while a tool that loops on a
/// malformed input is still stopped.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Milliseconds set by [`set_tool_timeout`]; 0 when unset.
static TIMEOUT_OVERRIDE_MS: AtomicU64 = AtomicU64::new(0);

/// Sets the tool limit for this process, ahead of [`TOOL_TIMEOUT_ENV`]; `None` goes back to
/// the environment and the default. For embedders and tests that cannot set the environment
/// safely (other threads may be reading it).
pub fn set_tool_timeout(limit: Option<Duration>) {
    let ms = limit.map_or(0, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
    });
    TIMEOUT_OVERRIDE_MS.store(ms, Ordering::Relaxed);
}

/// The wall-clock limit on one external tool run: [`set_tool_timeout`]'s, else
/// `$FLASHCORE_TOOL_TIMEOUT_S`, else [`DEFAULT_TOOL_TIMEOUT`]. A variable that is not a
/// positive number of seconds is an error, not silently the default.
pub fn tool_timeout() -> Result<Duration> {
    let ms = TIMEOUT_OVERRIDE_MS.load(Ordering::Relaxed);
    if ms != 0 {
        return Ok(Duration::from_millis(ms));
    }
    match std::env::var(TOOL_TIMEOUT_ENV) {
        Ok(v) if !v.trim().is_empty() => parse_timeout(v.trim()),
        _ => Ok(DEFAULT_TOOL_TIMEOUT),
    }
}

fn parse_timeout(v: &str) -> Result<Duration> {
    v.parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            Error::invalid(
                TOOL_TIMEOUT_ENV,
                format!("must be a positive number of seconds (e.g. 300), got `{v}`"),
            )
        })
}

/// Runs an external tool under [`tool_timeout`]; see [`run_tool_within`].
pub fn run_tool(name: &'static str, path: &Path, cmd: &mut Command) -> Result<Output> {
    run_tool_within(name, path, cmd, tool_timeout()?)
}

/// Runs `cmd` (the tool `name` at `path`) with stdin closed and stdout/stderr collected, and
/// kills it if it runs past `limit`. Output goes to anonymous temporary files rather than pipes,
/// so a child that writes a lot never blocks on a full pipe while we wait, and nothing is left
/// waiting on a pipe that a grandchild still holds. On timeout the child is killed and reaped
/// (no zombie) and the error names the tool, the limit and [`TOOL_TIMEOUT_ENV`]. The exit
/// status is returned as is; judging it is the caller's business.
pub fn run_tool_within(
    name: &'static str,
    path: &Path,
    cmd: &mut Command,
    limit: Duration,
) -> Result<Output> {
    let failed = |e: std::io::Error| Error::ToolFailed {
        tool: path.display().to_string(),
        message: e.to_string(),
    };
    let stdout = tempfile::tempfile().map_err(failed)?;
    let stderr = tempfile::tempfile().map_err(failed)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().map_err(failed)?)
        .stderr(stderr.try_clone().map_err(failed)?)
        .spawn()
        .map_err(failed)?;
    let start = Instant::now();
    let mut nap = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(e));
            }
        }
        let elapsed = start.elapsed();
        if elapsed >= limit {
            // SIGKILL, then wait: reaps the child even if it was exiting on its own meanwhile.
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::ToolTimeout {
                tool: name,
                path: path.display().to_string(),
                limit_s: limit.as_secs_f64(),
                env: TOOL_TIMEOUT_ENV,
            });
        }
        std::thread::sleep(nap.min(limit - elapsed));
        nap = (nap * 2).min(Duration::from_millis(50));
    };
    let read_back = |mut f: std::fs::File| -> std::io::Result<Vec<u8>> {
        f.rewind()?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    };
    Ok(Output {
        status,
        stdout: read_back(stdout).map_err(failed)?,
        stderr: read_back(stderr).map_err(failed)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_values() {
        assert_eq!(parse_timeout("300").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_timeout("0.25").unwrap(), Duration::from_millis(250));
        for bad in ["0", "-1", "abc", "inf", "NaN", "1e400"] {
            let e = parse_timeout(bad).unwrap_err().to_string();
            assert!(e.contains(TOOL_TIMEOUT_ENV) && e.contains(bad), "{e}");
        }
    }
}
