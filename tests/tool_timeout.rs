//! The wall-clock limit on the external tools the audit runs (nvdisasm, cuobjdump): a tool that
//! never finishes is killed and reaped, and `flashcore audit` exits 2 with an error that names
//! the tool, the limit and FLASHCORE_TOOL_TIMEOUT_S. Needs no CUDA tool: the hanging "tools"
//! are `sleep` and the scripts in tests/fake_tools/bin/.

use flashcore::jit::toolkit::{run_tool_within, TOOL_TIMEOUT_ENV};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn here(rel: &str) -> String {
    format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// Whether a process with this pid exists (a zombie still does: its /proc entry stays until
/// it is reaped).
fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_tool_past_its_limit_is_killed_reaped_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let sh = Path::new("/bin/sh");
    let mut cmd = Command::new(sh);
    cmd.arg("-c")
        .arg(r#"echo $$ > "$1"; exec sleep 60"#)
        .arg("sh")
        .arg(&pidfile);
    let t = Instant::now();
    let e = run_tool_within("nvdisasm", sh, &mut cmd, Duration::from_millis(300)).unwrap_err();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    match &e {
        flashcore::Error::ToolTimeout {
            tool, limit_s, env, ..
        } => {
            assert_eq!(*tool, "nvdisasm");
            assert_eq!(*limit_s, 0.3);
            assert_eq!(*env, TOOL_TIMEOUT_ENV);
        }
        other => panic!("expected ToolTimeout, got {other:?}"),
    }
    let msg = e.to_string();
    for part in ["nvdisasm", "0.3 s", "FLASHCORE_TOOL_TIMEOUT_S"] {
        assert!(msg.contains(part), "{msg}");
    }
    // Killed and waited for: no process (not even a zombie) is left with that pid.
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!exists(pid), "pid {pid} still exists after the timeout");
}

#[test]
fn a_tool_that_writes_a_lot_does_not_deadlock() {
    // Far more than a pipe holds (64 KiB) on both streams.
    let sh = Path::new("/bin/sh");
    let mut cmd = Command::new(sh);
    cmd.arg("-c")
        .arg("head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2; exit 3");
    let out = run_tool_within("nvdisasm", sh, &mut cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(out.stdout.len(), 3_000_000);
    assert_eq!(out.stderr.len(), 2_000_000);
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_grandchild_holding_the_output_does_not_hold_up_the_caller() {
    // The tool exits at once but leaves a background process with its stdout open: with pipes
    // read to end of file, the caller would wait for that process too.
    let sh = Path::new("/bin/sh");
    let mut cmd = Command::new(sh);
    cmd.arg("-c").arg("sleep 30 & echo done");
    let t = Instant::now();
    let out = run_tool_within("cuobjdump", sh, &mut cmd, Duration::from_secs(60)).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
}

/// `flashcore audit ARGS` with the fake tools and this limit: (exit code, stderr, seconds, pid
/// of the fake tool if it started).
fn audit_with_fake_tools(args: &[&str], limit: &str) -> (Option<i32>, String, f64, Option<u32>) {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let t = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_flashcore"))
        .arg("audit")
        .args(args)
        .env("FLASHCORE_CUDA_TOOLS", here("tests/fake_tools"))
        .env(TOOL_TIMEOUT_ENV, limit)
        .env("FAKE_TOOL_PIDFILE", &pidfile)
        .output()
        .unwrap();
    let secs = t.elapsed().as_secs_f64();
    let pid = std::fs::read_to_string(&pidfile)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        secs,
        pid,
    )
}

#[test]
fn audit_cli_exits_2_naming_nvdisasm_when_it_hangs() {
    let cubin = here("tests/audit_corpus/nvdisasm_hang.cubin");
    let (code, err, secs, pid) = audit_with_fake_tools(&["--cubin", &cubin], "0.5");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("flashcore: error: tool `nvdisasm`"),
        "{err}"
    );
    assert!(err.contains("0.5 s limit"), "{err}");
    assert!(err.contains("FLASHCORE_TOOL_TIMEOUT_S=SECONDS"), "{err}");
    assert!(secs < 20.0, "took {secs} s");
    let pid = pid.expect("the fake nvdisasm did not start");
    assert!(
        !exists(pid),
        "the fake nvdisasm (pid {pid}) was left running"
    );
}

#[test]
fn audit_cli_exits_2_naming_cuobjdump_when_it_hangs() {
    // A fat binary's magic number: the audit hands the file to cuobjdump to unwrap.
    let dir = tempfile::tempdir().unwrap();
    let fatbin = dir.path().join("k.fatbin");
    let mut bytes = 0xBA55_ED50u32.to_le_bytes().to_vec();
    bytes.extend([0u8; 60]);
    std::fs::write(&fatbin, bytes).unwrap();
    let (code, err, secs, pid) =
        audit_with_fake_tools(&["--cubin", fatbin.to_str().unwrap()], "0.5");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.starts_with("flashcore: error: tool `cuobjdump`"),
        "{err}"
    );
    assert!(err.contains("0.5 s limit") && err.contains("FLASHCORE_TOOL_TIMEOUT_S"));
    assert!(secs < 20.0, "took {secs} s");
    let pid = pid.expect("the fake cuobjdump did not start");
    assert!(
        !exists(pid),
        "the fake cuobjdump (pid {pid}) was left running"
    );
}

#[test]
fn a_bad_limit_is_a_usage_error_naming_the_variable() {
    let cubin = here("tests/audit_corpus/nvdisasm_hang.cubin");
    for bad in ["0", "-3", "soon"] {
        let (code, err, _, pid) = audit_with_fake_tools(&["--cubin", &cubin], bad);
        assert_eq!(code, Some(2), "{bad}: {err}");
        assert!(
            err.starts_with("flashcore: error: invalid argument `FLASHCORE_TOOL_TIMEOUT_S`")
                && err.contains(bad),
            "{err}"
        );
        assert_eq!(pid, None, "{bad}: the tool was started anyway");
    }
}
