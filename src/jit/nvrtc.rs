//! NVRTC: CUDA C++ source → sm_90a cubin, through cudarc's NVRTC bindings.
//!
//! cudarc loads NVRTC by soname and panics when it is missing, so we first open the library we
//! found ourselves (by full path) and keep it loaded: cudarc's later `dlopen("libnvrtc.so.13")`
//! then resolves to it, and absence is a typed error instead of a panic.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

static NVRTC: OnceLock<Result<(i32, i32), String>> = OnceLock::new();

/// The reason inside a lookup error, without its fix: the `NoNvrtc` error made from it adds the
/// fix, so the user reads each once.
fn reason_of(e: Error) -> String {
    match e {
        Error::NoNvrtc(reason) => reason,
        other => other.to_string(),
    }
}

/// Loads NVRTC once; returns its (major, minor) version.
pub fn ensure_loaded() -> Result<(i32, i32)> {
    NVRTC
        .get_or_init(|| {
            let path = super::toolkit::nvrtc_library().map_err(reason_of)?;
            // NVRTC dlopens its builtins library by soname at compile time; when it lives outside the
            // loader path (the PyPI wheel), load it first from beside libnvrtc so that lookup succeeds.
            if let Some(dir) = path.parent() {
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for e in entries.flatten() {
                        let name = e.file_name().to_string_lossy().into_owned();
                        if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.") {
                            // SAFETY: as for libnvrtc below.
                            if let Ok(b) = unsafe { libloading::Library::new(e.path()) } {
                                std::mem::forget(b);
                            }
                        }
                    }
                }
            }
            // SAFETY: loading a shared library runs its initialisers; libnvrtc has no unusual ones.
            let lib = unsafe { libloading::Library::new(&path) }
                .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
            std::mem::forget(lib); // stays loaded for the life of the process
            let (mut major, mut minor) = (0, 0);
            // SAFETY: the library is loaded; out-pointers are valid.
            let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
            if rc != sys::nvrtcResult::NVRTC_SUCCESS {
                return Err(format!("nvrtcVersion failed: {rc:?}"));
            }
            Ok((major, minor))
        })
        .clone()
        .map_err(Error::NoNvrtc)
}

fn check(rc: sys::nvrtcResult, what: &str) -> Result<()> {
    if rc == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::Other(format!("NVRTC {what} failed: {rc:?}")))
    }
}

/// A named header handed to NVRTC in memory (so `#include "name"` needs no files on disk).
pub struct Header<'a> {
    pub name: &'a str,
    pub source: &'a str,
}

/// Compiles `source` with `options` and returns the cubin. `kernel` names it in error messages.
pub fn compile(
    kernel: &str,
    source: &str,
    headers: &[Header<'_>],
    options: &[String],
) -> Result<Vec<u8>> {
    compile_as(kernel, &format!("{kernel}.cu"), source, headers, options)
}

/// As [`compile`], with the program's file name given: NVRTC resolves `#include "..."` beside
/// it and records it in the line table (`-lineinfo`), so findings can name the user's own file.
pub fn compile_as(
    kernel: &str,
    program_name: &str,
    source: &str,
    headers: &[Header<'_>],
    options: &[String],
) -> Result<Vec<u8>> {
    ensure_loaded()?;
    let to_c = |s: &str| {
        CString::new(s).map_err(|_| Error::Other(format!("NUL byte in input for {kernel}")))
    };
    let src = to_c(source)?;
    let name = to_c(program_name)?;
    let header_srcs = headers
        .iter()
        .map(|h| to_c(h.source))
        .collect::<Result<Vec<_>>>()?;
    let header_names = headers
        .iter()
        .map(|h| to_c(h.name))
        .collect::<Result<Vec<_>>>()?;
    let header_src_ptrs: Vec<*const c_char> = header_srcs.iter().map(|s| s.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|s| s.as_ptr()).collect();
    let opts = options
        .iter()
        .map(|o| to_c(o))
        .collect::<Result<Vec<_>>>()?;
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|s| s.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all pointers come from live CStrings of the stated counts.
    unsafe {
        check(
            sys::nvrtcCreateProgram(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                headers.len() as i32,
                if headers.is_empty() {
                    std::ptr::null()
                } else {
                    header_src_ptrs.as_ptr()
                },
                if headers.is_empty() {
                    std::ptr::null()
                } else {
                    header_name_ptrs.as_ptr()
                },
            ),
            "create program",
        )?;
    }
    struct Guard(sys::nvrtcProgram);
    impl Drop for Guard {
        fn drop(&mut self) {
            // SAFETY: the program was created above and is destroyed once.
            unsafe {
                sys::nvrtcDestroyProgram(&mut self.0);
            }
        }
    }
    let guard = Guard(prog);

    // SAFETY: program is valid; option pointers are live.
    let rc = unsafe { sys::nvrtcCompileProgram(guard.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if rc != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Compile {
            kernel: kernel.to_string(),
            log: program_log(guard.0),
        });
    }
    if std::env::var_os("FLASHCORE_JIT_LOG").is_some() {
        let log = program_log(guard.0);
        if !log.trim().is_empty() {
            eprintln!("flashcore: NVRTC log for {kernel}:\n{log}");
        }
    }
    let mut size = 0usize;
    // SAFETY: program compiled; out-pointer valid, buffer sized from NVRTC's answer.
    unsafe { check(sys::nvrtcGetCUBINSize(guard.0, &mut size), "get cubin size")? };
    let mut cubin = vec![0u8; size];
    unsafe {
        check(
            sys::nvrtcGetCUBIN(guard.0, cubin.as_mut_ptr() as *mut c_char),
            "get cubin",
        )?
    };
    if cubin.is_empty() {
        return Err(Error::Compile {
            kernel: kernel.to_string(),
            log: "NVRTC produced no cubin (is --gpu-architecture a real sm_ target?)".into(),
        });
    }
    Ok(cubin)
}

fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: valid program; buffer sized from NVRTC's answer.
    unsafe {
        if sys::nvrtcGetProgramLogSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS
            || size == 0
        {
            return String::new();
        }
        let mut buf = vec![0 as c_char; size];
        if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr()) != sys::nvrtcResult::NVRTC_SUCCESS {
            return String::new();
        }
        CStr::from_ptr(buf.as_ptr()).to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_nvrtc_says_its_cause_and_fix_once() {
        let lookup = Error::NoNvrtc("searched /nowhere".into());
        let msg = Error::NoNvrtc(reason_of(lookup)).to_string();
        assert_eq!(msg.matches("NVRTC not found").count(), 1, "{msg}");
        assert_eq!(msg.matches("install-cuda-tools.sh").count(), 1, "{msg}");
        assert!(msg.contains("searched /nowhere"), "{msg}");
    }
}
