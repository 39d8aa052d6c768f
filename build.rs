//! Records the git commit the binary is built from (`FLASHCORE_BUILD_COMMIT`), so benchmark and
//! leakage records name the build that produced them, whatever directory they are run from.
//! Empty when the source is not a git checkout or git is missing.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"])
        .filter(|c| c.len() == 40 && c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_default();
    println!("cargo:rustc-env=FLASHCORE_BUILD_COMMIT={commit}");
    // Re-run when HEAD moves: HEAD itself (branch switches), the branch's ref and packed refs.
    for (flag, file) in [("--git-path", "HEAD"), ("--git-path", "packed-refs")] {
        if let Some(p) = git(&["rev-parse", flag, file]) {
            emit(&p);
        }
    }
    if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(p) = git(&["rev-parse", "--git-path", &r]) {
            emit(&p);
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

fn emit(path: &str) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if p.exists() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
}
