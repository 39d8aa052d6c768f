//! The suites' shape lists, and bench/sdpa.py's pure parts against flashcore's (same shapes,
//! same statistics bit for bit, same rotation, a record flashcore can read).

use flashcore::attention::{DType, Layout};
use flashcore::bench::record::{Mode, Pass, Record, Shape, Status};
use flashcore::bench::stats::{percentile, Stats};
use flashcore::bench::suites::{backward, decode, fa3, label, seed, Suite};
use flashcore::bench::timing::{graph_schedules, sets_needed};
use std::process::Command;

#[test]
fn seed_suite_shapes() {
    let s = seed(Layout::Bshd);
    assert_eq!(s.len(), 16);
    let got: Vec<(DType, usize, usize, usize, usize, bool)> = s
        .iter()
        .map(|p| {
            (
                p.dtype, p.batch, p.heads_q, p.seqlen_q, p.head_dim, p.causal,
            )
        })
        .collect();
    let mut want = Vec::new();
    for dt in [DType::F16, DType::Bf16] {
        for (b, h, sl, d, c) in [
            (1, 8, 512, 64, false),
            (1, 8, 512, 64, true),
            (1, 16, 1024, 64, true),
            (16, 16, 2048, 64, false),
            (16, 16, 2048, 64, true),
            (2, 16, 8192, 128, false),
            (2, 16, 8192, 128, true),
            (1, 16, 16384, 128, false),
        ] {
            want.push((dt, b, h, sl, d, c));
        }
    }
    assert_eq!(got, want);
    for p in &s {
        assert_eq!(
            (p.seqlen_k, p.heads_kv, p.layout),
            (p.seqlen_q, p.heads_q, Layout::Bshd)
        );
        assert_eq!(p.scale, None);
    }
    assert!(seed(Layout::Bhsd).iter().all(|p| p.layout == Layout::Bhsd));
    assert_eq!(Suite::Seed.shapes(Layout::Bshd), s);
}

#[test]
fn fa3_suite_shapes() {
    let s = fa3(Layout::Bshd);
    assert_eq!(s.len(), 6 * 2 * 3 * 2);
    for p in &s {
        // 16k tokens, hidden 2048.
        assert_eq!(p.batch * p.seqlen_q, 16384);
        assert_eq!(p.heads_q * p.head_dim, 2048);
        assert!([64, 128, 256].contains(&p.head_dim));
        assert!([512, 1024, 2048, 4096, 8192, 16384].contains(&p.seqlen_q));
    }
    for dt in [DType::F16, DType::Bf16] {
        for d in [64, 128, 256] {
            for c in [false, true] {
                let n = s
                    .iter()
                    .filter(|p| p.dtype == dt && p.head_dim == d && p.causal == c)
                    .count();
                assert_eq!(n, 6, "{dt:?} d{d} causal={c}");
            }
        }
    }
    assert_eq!(label(&s[0]), "b32 h32 s512 d64");
    assert_eq!(label(&s[11]), "b1 h32 s16384 d64 causal");
}

#[test]
fn labels() {
    let mut p = flashcore::AttentionParams::new(2, 32, 512, 128)
        .seqlen_k(1024)
        .causal(true);
    p.heads_kv = 8;
    assert_eq!(label(&p), "b2 h32/8 s512/1024 d128 causal");
}

/// `python3 bench/sdpa.py --self-test`, or None (printed) when python3 is not there.
fn python_self_test() -> Option<serde_json::Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/sdpa.py");
    let out = match Command::new("python3")
        .args([script, "--self-test"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED python cross-check: cannot run python3 ({e})");
            return None;
        }
    };
    assert!(
        out.status.success(),
        "sdpa.py --self-test failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("self-test prints JSON"))
}

#[test]
fn python_matches_rust() {
    let Some(py) = python_self_test() else { return };
    // Statistics: bit-identical.
    let samples = [12.0, 3.0, 1.0, 5.0, 2.0, 4.0];
    let rs = Stats::from_samples(&samples).unwrap();
    let ps: Stats = serde_json::from_value(py["stats"].clone()).unwrap();
    assert_eq!(rs, ps);
    let big: Vec<f64> = (1..=1000).map(f64::from).collect();
    let ps: Stats = serde_json::from_value(py["stats_1000"].clone()).unwrap();
    assert_eq!(Stats::from_samples(&big).unwrap(), ps);
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let pp: Vec<f64> = serde_json::from_value(py["percentiles"].clone()).unwrap();
    let rp: Vec<f64> = [0.0, 25.0, 50.0, 95.0, 99.0, 100.0]
        .iter()
        .map(|&p| percentile(&sorted, p).unwrap())
        .collect();
    assert_eq!(rp, pp);
    // Shapes and labels.
    for (name, rust) in [
        ("seed", seed(Layout::Bshd)),
        ("fa3", fa3(Layout::Bshd)),
        ("decode", decode(Layout::Bshd)),
        ("backward", backward(Layout::Bshd)),
    ] {
        let py_shapes: Vec<(DType, Shape)> = serde_json::from_value(py[name].clone()).unwrap();
        let rust_shapes: Vec<(DType, Shape)> =
            rust.iter().map(|p| (p.dtype, Shape::of(p))).collect();
        assert_eq!(py_shapes, rust_shapes, "suite {name}");
    }
    let py_labels: Vec<String> = serde_json::from_value(py["labels"].clone()).unwrap();
    let rust_labels: Vec<String> = seed(Layout::Bshd).iter().map(label).collect();
    assert_eq!(py_labels, rust_labels);
    // Rotation.
    let sn: Vec<usize> = serde_json::from_value(py["sets_needed"].clone()).unwrap();
    assert_eq!(
        sn,
        vec![
            sets_needed(
                50 << 20,
                3 * 512 * 8 * 64 * 2,
                4 * 512 * 8 * 64 * 2,
                1 << 40
            ),
            sets_needed(50 << 20, 300 << 20, 400 << 20, 1 << 40)
        ]
    );
    let sch: Vec<Vec<usize>> = serde_json::from_value(py["schedules"].clone()).unwrap();
    assert_eq!(sch, graph_schedules(5, 2));
    // nvidia-smi parsing.
    assert_eq!(py["smi"][0]["sm_mhz"], 1980.0);
    assert_eq!(py["smi"][1], "580.95.05");
    // A Python record reads as a flashcore Record with the same numbers.
    let r: Record = serde_json::from_value(py["record"].clone()).unwrap();
    assert_eq!(r.implementation, "sdpa-flash");
    // FlashAttention-4 records are named "fa4", the flashcore Python package's op
    // "flashcore-torch", the SDPA backends "sdpa-<backend>".
    let names: Vec<String> = serde_json::from_value(py["impl_names"].clone()).unwrap();
    assert_eq!(
        names,
        [
            "sdpa-flash",
            "sdpa-cudnn",
            "sdpa-efficient",
            "fa4",
            "flashcore-torch"
        ]
        .map(String::from)
    );
    assert_eq!(
        (r.mode, r.status, r.dtype),
        (Mode::Graph, Status::Ok, DType::F16)
    );
    let p = flashcore::AttentionParams::new(1, 8, 512, 64).causal(true);
    assert_eq!(r.flops, p.flops());
    assert_eq!(r.time_us, Some(rs));
    assert_eq!(
        r.tflops,
        Some(flashcore::bench::stats::tflops(p.flops(), rs.median))
    );
    assert_eq!(r.pass, Pass::Forward);
    // A backward record: its pass, and FLOPs 2.5× the forward's.
    let r: Record = serde_json::from_value(py["backward_record"].clone()).unwrap();
    let p = flashcore::AttentionParams::new(2, 16, 8192, 128).dtype(DType::Bf16);
    assert_eq!((r.pass, r.flops), (Pass::Backward, 2.5 * p.flops()));
    assert_eq!(
        r.tflops,
        Some(flashcore::bench::stats::tflops(2.5 * p.flops(), rs.median))
    );
    // The backward's buffer-set bytes, counted alike.
    let mut p = flashcore::AttentionParams::new(2, 8, 100, 64).seqlen_k(300);
    p.heads_kv = 2;
    let sb: (u64, u64) = serde_json::from_value(py["backward_set_bytes"].clone()).unwrap();
    assert_eq!(sb, flashcore::bench::backward::set_bytes(&p));
}

#[test]
fn python_argument_errors_exit_2() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/bench/sdpa.py");
    let run = |args: &[&str]| {
        Command::new("python3")
            .arg(script)
            .args(args)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .output()
    };
    let Ok(o) = run(&["--suite", "seed", "--heads", "3"]) else {
        eprintln!("SKIPPED python argument check: no python3");
        return;
    };
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        run(&["--reps", "0", "--suite", "seed"])
            .unwrap()
            .status
            .code(),
        Some(2)
    );
    assert_eq!(
        run(&["--backends", "bogus"]).unwrap().status.code(),
        Some(2)
    );
    assert_eq!(
        run(&["--backends", "fa4,bogus"]).unwrap().status.code(),
        Some(2)
    );
    // fa4 is a known backend: the shapes print (no GPU or torch needed for that).
    let o = run(&["--backends", "fa4", "--suite", "seed", "--print-shapes"]).unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["--suite", "fa3", "--dtype", "bf16", "--print-shapes"]).unwrap();
    assert!(o.status.success());
    let v: Vec<(DType, Shape)> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.len(), 36);
    // --headdim with a suite keeps that head dim's shapes (the d256 rows: H = 8).
    let o = run(&[
        "--suite",
        "fa3",
        "--dtype",
        "bf16",
        "--headdim",
        "256",
        "--print-shapes",
    ])
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Vec<(DType, Shape)> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.len(), 12);
    assert!(v.iter().all(|(_, s)| s.head_dim == 256 && s.heads_q == 8));
    let o = run(&["--suite", "seed", "--headdim", "96", "--print-shapes"]).unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = run(&[
        "--heads",
        "16",
        "--seqlen",
        "4096",
        "--headdim",
        "128",
        "--causal",
        "--print-shapes",
    ])
    .unwrap();
    let v: Vec<(DType, Shape)> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].0, DType::F16);
    assert_eq!(
        v[0].1,
        Shape::of(&flashcore::AttentionParams::new(1, 16, 4096, 128).causal(true))
    );
    // --window: the same shape record as `flashcore bench --window` writes; bad values exit 2.
    let o = run(&[
        "--heads",
        "16",
        "--seqlen",
        "8192",
        "--headdim",
        "128",
        "--causal",
        "--window",
        "4095,0",
        "--print-shapes",
    ])
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Vec<(DType, Shape)> = serde_json::from_slice(&o.stdout).unwrap();
    let mut want = Shape::of(&flashcore::AttentionParams::new(1, 16, 8192, 128).causal(true));
    want.window = Some((4095, 0));
    assert_eq!(v[0].1, want);
    for bad in ["4,x", "-2,0", "5"] {
        let o = run(&[
            "--heads",
            "16",
            "--seqlen",
            "64",
            "--headdim",
            "64",
            "--window",
            bad,
        ])
        .unwrap();
        assert_eq!(o.status.code(), Some(2), "--window {bad}");
    }
}
