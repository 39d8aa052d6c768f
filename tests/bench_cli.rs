//! `flashcore bench` as a process: usage errors, the no-GPU failure, and the GPU-free paths
//! (--from-json, --compare, --plot).

use std::process::Command;

fn flashcore(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flashcore"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run flashcore")
}

const RECORD: &str = r#"{"implementation":"IMP","suite":"seed","shape":{"batch":1,"heads_q":8,
 "heads_kv":8,"seqlen_q":512,"seqlen_k":512,"head_dim":64,"causal":false,"layout":"bshd"},
 "dtype":"f16","mode":"graph","status":"ok","skip_reason":null,"flops":536870912.0,
 "time_us":{"n":3,"min":MED,"median":MED,"mean":MED,"p95":MED,"p99":MED,"max":MED,"stddev":0.0},
 "tflops":1.0,"method":null,"env":{"gpu":"H100","date":"2026-11-22T00:00:00Z"}}"#;

fn file(records: &[(&str, f64)]) -> String {
    let recs: Vec<String> = records
        .iter()
        .map(|(imp, med)| RECORD.replace("IMP", imp).replace("MED", &med.to_string()))
        .collect();
    format!(
        r#"{{"schema":"flashcore-bench","version":1,"records":[{}]}}"#,
        recs.join(",")
    )
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(flashcore(&[]).status.code(), Some(2));
    assert_eq!(
        flashcore(&["--suite", "seed", "--heads", "8"])
            .status
            .code(),
        Some(2)
    );
    assert_eq!(flashcore(&["--seqlen", "512"]).status.code(), Some(2));
    assert_eq!(
        flashcore(&["--suite", "seed", "--reps", "0"]).status.code(),
        Some(2)
    );
    assert_eq!(flashcore(&["--suite", "nope"]).status.code(), Some(2));
    assert_eq!(
        flashcore(&["--suite", "seed", "--mode", "sometimes"])
            .status
            .code(),
        Some(2)
    );
}

#[test]
fn no_gpu_is_a_runtime_failure() {
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("SKIPPED no_gpu_is_a_runtime_failure: this machine has a GPU");
        return;
    }
    let o = flashcore(&[
        "--heads",
        "8",
        "--seqlen",
        "512",
        "--headdim",
        "64",
        "--reps",
        "3",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("flashcore: error:"), "{err}");
}

#[test]
fn join_and_plot_from_files() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("ours.json");
    let sdpa = dir.path().join("sdpa.json");
    let png = dir.path().join("p.png");
    std::fs::write(&ours, file(&[("flashcore", 8.0)])).unwrap();
    std::fs::write(&sdpa, file(&[("sdpa-flash", 10.0), ("sdpa-cudnn", 9.0)])).unwrap();
    let o = flashcore(&[
        "--from-json",
        ours.to_str().unwrap(),
        "--compare",
        sdpa.to_str().unwrap(),
        "--plot",
        png.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        out.contains("sdpa-cudnn_us") && out.contains("sdpa-flash_us"),
        "{out}"
    );
    assert!(out.contains("0.889"), "{out}");
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
    // A missing file is a runtime failure.
    let o = flashcore(&[
        "--from-json",
        dir.path().join("none.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
}

/// `--phases`: zero launches is a usage error (exit 2, said before any GPU is looked for); a
/// shape flag is still required; without a GPU it fails like a timing run (exit 1).
#[test]
fn phases_errors() {
    let shape = ["--heads", "8", "--seqlen", "512", "--headdim", "64"];
    let o = flashcore(&[&shape[..], &["--phases", "0"]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--phases needs at least one launch"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(flashcore(&["--phases", "5"]).status.code(), Some(2));
    let o = flashcore(&[&shape[..], &["--phases", "5", "--backward"]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("drop --backward"));
    if std::path::Path::new("/dev/nvidia0").exists() {
        eprintln!("SKIPPED phases_errors (no-GPU part): this machine has a GPU");
        return;
    }
    let o = flashcore(&[&shape[..], &["--phases", "5"]].concat());
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("flashcore: error:"));
}
