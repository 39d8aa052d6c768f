//! `audit --source`: a user's CUDA file compiled by NVRTC the way nvcc would see it — the
//! toolkit's headers on the search path, the user's `-I` folders and `-D` macros, a C++
//! standard and a target architecture — with line info, so findings name source lines.
//!
//! Shipped kernels never come through here: they keep [`crate::jit::base_options`] and the
//! cache. A user's file is compiled afresh on every audit, since the headers it includes from
//! disk are not part of any cache key.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// C++ standards NVRTC 13 accepts for `--std`.
pub const STANDARDS: &[&str] = &["c++11", "c++14", "c++17", "c++20"];

/// How to compile a user's CUDA file.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// `-I` folders, searched before the toolkit's own headers (as nvcc does).
    pub include_dirs: Vec<PathBuf>,
    /// `-D NAME` or `-D NAME=VALUE`.
    pub defines: Vec<String>,
    /// One of [`STANDARDS`].
    pub std: String,
    /// A real SASS target such as `sm_90a` or `sm_80` ([`check_arch`]).
    pub arch: String,
    /// Emit line info (`-lineinfo`): does not change the generated code.
    pub lineinfo: bool,
}

impl Default for SourceOptions {
    fn default() -> Self {
        SourceOptions {
            include_dirs: Vec::new(),
            defines: Vec::new(),
            std: "c++17".into(),
            arch: crate::jit::ARCH.into(),
            lineinfo: true,
        }
    }
}

/// Checks a SASS architecture name: `sm_` then two or three digits and an optional `a` or `f`
/// suffix (`sm_90a`, `sm_80`, `sm_100f`).
pub fn check_arch(arch: &str) -> std::result::Result<(), String> {
    let ok = arch.strip_prefix("sm_").is_some_and(|rest| {
        let digits = rest.trim_end_matches(['a', 'f']);
        (2..=3).contains(&digits.len())
            && digits.bytes().all(|b| b.is_ascii_digit())
            && rest.len() - digits.len() <= 1
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "`{arch}` is not a SASS architecture: expected sm_ and its number, e.g. sm_90a, sm_80"
        ))
    }
}

/// Checks a `-D` argument: a C identifier, optionally followed by `=` and a value.
pub fn check_define(d: &str) -> std::result::Result<(), String> {
    let name = d.split('=').next().unwrap_or("");
    let ident = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ident && !d.contains('\0') {
        Ok(())
    } else {
        Err(format!(
            "`{d}` is not a macro definition: expected NAME or NAME=VALUE with NAME a C identifier"
        ))
    }
}

impl SourceOptions {
    /// The NVRTC command line: the project's code-generation options (no fast math, FMA
    /// contraction on), the user's folders, then the toolkit's, the macros, and `-lineinfo`.
    pub fn nvrtc_options(&self) -> Result<Vec<String>> {
        check_arch(&self.arch).map_err(|e| Error::invalid("--arch", e))?;
        if !STANDARDS.contains(&self.std.as_str()) {
            return Err(Error::invalid(
                "--std",
                format!("`{}` is not one of {}", self.std, STANDARDS.join(", ")),
            ));
        }
        let mut o = vec![
            format!("--gpu-architecture={}", self.arch),
            format!("--std={}", self.std),
            "--device-as-default-execution-space".into(),
            "--fmad=true".into(),
        ];
        for d in &self.include_dirs {
            if !d.is_dir() {
                return Err(Error::invalid(
                    "-I",
                    format!("include directory {} does not exist", d.display()),
                ));
            }
            o.push(format!("--include-path={}", d.display()));
        }
        for d in crate::jit::toolkit::include_dirs() {
            o.push(format!("--include-path={}", d.display()));
        }
        for d in &self.defines {
            check_define(d).map_err(|e| Error::invalid("-D", e))?;
            o.push(format!("--define-macro={d}"));
        }
        if self.lineinfo {
            o.push("--generate-line-info".into());
        }
        Ok(o)
    }
}

/// Compiles the CUDA file at `path` to a cubin for `opts.arch`. A missing header gets a hint
/// that says where the toolkit's headers were looked for.
pub fn compile(path: &Path, src: &str, opts: &SourceOptions) -> Result<Vec<u8>> {
    let options = opts.nvrtc_options()?;
    let label = path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "audit".into());
    let program = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    crate::jit::nvrtc::compile_as(&label, &program.to_string_lossy(), src, &[], &options).map_err(
        |e| match e {
            Error::Compile { kernel, log } if log.contains("cannot open source file") => {
                Error::Compile {
                    kernel,
                    log: format!("{log}\n{}", header_hint()),
                }
            }
            other => other,
        },
    )
}

fn header_hint() -> String {
    let found = crate::jit::toolkit::include_dirs();
    if found.is_empty() {
        let roots: Vec<String> = crate::jit::toolkit::toolkit_roots()
            .iter()
            .map(|r| format!("{}/include", r.display()))
            .collect();
        format!(
            "hint: no CUDA toolkit headers found (looked in {}); run `bash scripts/install-cuda-tools.sh` or set CUDA_HOME; add your own folders with -I DIR",
            roots.join(", ")
        )
    } else {
        let dirs: Vec<String> = found.iter().map(|d| d.display().to_string()).collect();
        format!(
            "hint: toolkit headers were searched in {}; add your own folders with -I DIR",
            dirs.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_names() {
        for ok in ["sm_90a", "sm_80", "sm_100f", "sm_120"] {
            assert!(check_arch(ok).is_ok(), "{ok}");
        }
        for bad in [
            "sm90",
            "compute_90",
            "sm_9",
            "sm_90ab",
            "sm_",
            "sm_x0",
            "sm_1000",
        ] {
            assert!(check_arch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn define_names() {
        for ok in ["LEAK", "N=4", "_X=a b", "A1="] {
            assert!(check_define(ok).is_ok(), "{ok}");
        }
        for bad in ["", "=1", "1A", "A-B=2", "A B"] {
            assert!(check_define(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_carry_the_flags() {
        let dir = std::env::temp_dir();
        let o = SourceOptions {
            include_dirs: vec![dir.clone()],
            defines: vec!["LEAK=1".into()],
            std: "c++20".into(),
            arch: "sm_80".into(),
            lineinfo: true,
        }
        .nvrtc_options()
        .unwrap();
        assert!(o.contains(&"--gpu-architecture=sm_80".to_string()), "{o:?}");
        assert!(o.contains(&"--std=c++20".to_string()), "{o:?}");
        assert!(o.contains(&"--define-macro=LEAK=1".to_string()), "{o:?}");
        assert!(
            o.contains(&format!("--include-path={}", dir.display())),
            "{o:?}"
        );
        assert!(o.contains(&"--generate-line-info".to_string()), "{o:?}");
        // The user's folders come before the toolkit's.
        let user = o.iter().position(|x| x.contains(&*dir.to_string_lossy()));
        let first_inc = o.iter().position(|x| x.starts_with("--include-path"));
        assert_eq!(user, first_inc);
    }

    #[test]
    fn bad_options_are_named() {
        let e = SourceOptions {
            std: "c++98".into(),
            ..Default::default()
        }
        .nvrtc_options()
        .unwrap_err()
        .to_string();
        assert!(e.contains("--std") && e.contains("c++98"), "{e}");
        let e = SourceOptions {
            include_dirs: vec!["/no/such/dir".into()],
            ..Default::default()
        }
        .nvrtc_options()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/no/such/dir") && e.contains("does not exist"),
            "{e}"
        );
    }
}
