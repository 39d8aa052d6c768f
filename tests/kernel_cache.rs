//! The on-disk kernel cache under concurrency and failure: two processes compiling the same
//! kernel into one empty cache folder both succeed and leave one valid entry (no torn file, no
//! temporary); a cache folder that cannot be created costs a warning, not the compilation.
//! Needs NVRTC (installed by scripts/install-cuda-tools.sh), not a GPU.

use std::path::Path;
use std::process::{Command, Output};

const KERNEL: &str =
    r#"extern "C" __global__ void k(float* x) { x[threadIdx.x] = 2.0f * x[threadIdx.x]; }"#;

/// In a child process (FC_CACHE_CHILD=1): compile the kernel through the cache and report.
#[test]
fn child_compile() {
    if std::env::var_os("FC_CACHE_CHILD").is_none() {
        return; // only meaningful as a child of the tests below
    }
    let cubin = flashcore::jit::compile_cached("k", KERNEL, &[], &flashcore::jit::base_options())
        .expect("compile through the cache");
    assert!(cubin.starts_with(b"\x7fELF"), "a cubin is an ELF file");
    println!("CHILD-OK {}", cubin.len());
}

fn spawn_child(cache: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_compile",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FC_CACHE_CHILD", "1")
        .env("FLASHCORE_CACHE_DIR", cache)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the test binary")
}

fn child_ok(o: &Output) -> bool {
    o.status.success() && String::from_utf8_lossy(&o.stdout).contains("CHILD-OK")
}

fn nvrtc_available() -> bool {
    match flashcore::jit::nvrtc::ensure_loaded() {
        Ok(_) => true,
        Err(e) => {
            eprintln!("SKIPPED kernel cache tests: {e}");
            false
        }
    }
}

#[test]
fn two_processes_filling_one_cache_both_succeed_and_leave_one_entry() {
    if !nvrtc_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    for round in 0..2 {
        // Round 0 races two compilations into an empty folder; round 1 reads what they left.
        let (a, b) = (spawn_child(&cache), spawn_child(&cache));
        let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
        for o in [&a, &b] {
            assert!(
                child_ok(o),
                "round {round}: {}\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(!String::from_utf8_lossy(&o.stderr).contains("warning"));
        }
        let names: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "one entry, no temporaries: {names:?}");
        assert!(names[0].ends_with(".cubin"), "{names:?}");
        let key = names[0].trim_end_matches(".cubin");
        let cubin = flashcore::jit::cache::load(&cache, key).expect("a valid entry");
        assert!(cubin.starts_with(b"\x7fELF"));
    }
}

#[test]
fn an_unwritable_cache_warns_and_still_compiles() {
    if !nvrtc_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A folder under a regular file cannot be created, whoever runs the test (root included).
    let blocker = dir.path().join("not-a-folder");
    std::fs::write(&blocker, b"").unwrap();
    let o = spawn_child(&blocker.join("cache"))
        .wait_with_output()
        .unwrap();
    assert!(child_ok(&o), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("warning: cannot write kernel cache").count(),
        1,
        "{err}"
    );
}
