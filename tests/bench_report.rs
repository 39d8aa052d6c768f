//! JSON schema round trips, environment parsing, the results table, the join with other
//! implementations, and plot rendering (all CPU-only).

use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::bench::env::{iso8601_utc, parse_smi_line};
use flashcore::bench::plot;
use flashcore::bench::record::{BenchFile, Clocks, Env, Method, Mode, Pass, Record, Status};
use flashcore::bench::report::{format_join, format_results, join};
use flashcore::bench::{make_pass_record, make_record};

fn env() -> Env {
    Env {
        gpu: Some("NVIDIA H100 80GB HBM3".into()),
        driver_version: Some("580.95.05".into()),
        cuda_driver_version: Some(13000),
        clocks_start: Some(Clocks {
            sm_mhz: Some(1980.0),
            mem_mhz: Some(2619.0),
        }),
        clocks_end: Some(Clocks {
            sm_mhz: Some(1755.0),
            mem_mhz: None,
        }),
        git_commit: Some("0123abcd".into()),
        date: "2026-11-22T08:00:00Z".into(),
        software: [("flashcore".to_string(), "0.1.0".to_string())].into(),
    }
}

/// A measured record of `imp` whose samples are all `us`.
fn rec(imp: &str, p: &AttentionParams, mode: Mode, us: Option<f64>) -> Record {
    let outcome = match us {
        Some(t) => Ok(vec![t; 5]),
        None => Err("No available kernel".to_string()),
    };
    let mut r = make_record(
        p,
        mode,
        outcome,
        Some(Method {
            warmup: 20,
            reps: 5,
            graph_calls: (mode == Mode::Graph).then_some(20),
            buffer_sets: 67,
            input_bytes_per_set: 1 << 20,
            l2_bytes: Some(50 << 20),
        }),
        Some("seed".into()),
        env(),
    );
    r.implementation = imp.into();
    r
}

fn shapes() -> Vec<AttentionParams> {
    vec![
        AttentionParams::new(1, 8, 512, 64),
        AttentionParams::new(16, 16, 2048, 64).causal(true),
        AttentionParams::new(2, 16, 8192, 128).dtype(DType::Bf16),
    ]
}

#[test]
fn json_round_trip() {
    let p = &shapes();
    let recs = vec![
        rec("flashcore", &p[0], Mode::Event, Some(30.0)),
        rec("flashcore", &p[0], Mode::Graph, Some(9.0)),
        rec("flashcore", &p[2], Mode::Graph, None),
    ];
    let file = BenchFile::new(recs.clone());
    let text = file.to_json().unwrap();
    let back = BenchFile::from_json(&text).unwrap();
    assert_eq!(back, file);
    // The field names documented in docs/bench-json.md.
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "flashcore-bench");
    assert_eq!(v["version"], 1);
    let r0 = &v["records"][0];
    for key in [
        "implementation",
        "suite",
        "shape",
        "dtype",
        "mode",
        "status",
        "skip_reason",
        "flops",
        "time_us",
        "tflops",
        "method",
        "env",
    ] {
        assert!(r0.get(key).is_some(), "record lacks `{key}`");
    }
    for key in ["n", "min", "median", "mean", "p95", "p99", "max", "stddev"] {
        assert!(r0["time_us"].get(key).is_some(), "time_us lacks `{key}`");
    }
    for key in [
        "gpu",
        "driver_version",
        "cuda_driver_version",
        "clocks_start",
        "clocks_end",
        "git_commit",
        "date",
        "software",
    ] {
        assert!(r0["env"].get(key).is_some(), "env lacks `{key}`");
    }
    assert_eq!(r0["dtype"], "f16");
    assert_eq!(r0["mode"], "event");
    assert_eq!(r0["status"], "ok");
    assert_eq!(r0["shape"]["layout"], "bshd");
    assert_eq!(r0["tflops"].as_f64().unwrap(), p[0].flops() / 30e-6 / 1e12);
    let skipped = &v["records"][2];
    assert_eq!(skipped["status"], "skipped");
    assert_eq!(skipped["skip_reason"], "No available kernel");
    assert!(skipped["time_us"].is_null() && skipped["tflops"].is_null());
    // A bare array of records reads too; unknown values may be null or absent.
    let arr = serde_json::to_string(&recs).unwrap();
    assert_eq!(BenchFile::from_json(&arr).unwrap().records, recs);
    let minimal = r#"[{"implementation":"x","shape":{"batch":1,"heads_q":8,"heads_kv":8,
        "seqlen_q":512,"seqlen_k":512,"head_dim":64,"causal":false},"dtype":"bf16",
        "mode":"graph","status":"ok","flops":1e9,"time_us":null,"env":{"gpu":null,"date":"d"}}]"#;
    let m = BenchFile::from_json(minimal).unwrap();
    assert_eq!(m.records[0].shape.layout, Layout::Bshd);
    assert!(!m.records[0].is_ok());
    // Wrong schema or a newer version is refused.
    assert!(BenchFile::from_json(r#"{"schema":"other","version":1,"records":[]}"#).is_err());
    assert!(
        BenchFile::from_json(r#"{"schema":"flashcore-bench","version":99,"records":[]}"#).is_err()
    );
    assert!(BenchFile::from_json("not json").is_err());
    // Files.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("b.json");
    file.write(&path).unwrap();
    assert_eq!(BenchFile::read(&path).unwrap(), file);
}

#[test]
fn skipped_records_have_no_numbers() {
    let p = &shapes()[0];
    let r = make_record(p, Mode::Graph, Ok(vec![]), None, None, env());
    assert_eq!(r.status, Status::Skipped);
    assert_eq!(r.skip_reason.as_deref(), Some("no finite samples"));
    assert!(r.time_us.is_none() && r.tflops.is_none());
    assert_eq!(r.flops, p.flops());
}

#[test]
fn smi_and_dates() {
    let r = parse_smi_line("1980 MHz, 2619 MHz, 580.95.05").unwrap();
    assert_eq!(r.clocks.sm_mhz, Some(1980.0));
    assert_eq!(r.clocks.mem_mhz, Some(2619.0));
    assert_eq!(r.driver_version.as_deref(), Some("580.95.05"));
    let r = parse_smi_line("345, [N/A], [N/A]").unwrap();
    assert_eq!(
        (r.clocks.sm_mhz, r.clocks.mem_mhz, r.driver_version),
        (Some(345.0), None, None)
    );
    assert!(parse_smi_line("garbage").is_none());
    assert!(flashcore::bench::env::is_commit("0123abcd"));
    assert!(!flashcore::bench::env::is_commit("HEAD"));
    assert!(!flashcore::bench::env::is_commit(""));
    assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00Z");
    assert_eq!(iso8601_utc(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(iso8601_utc(1_795_338_245), "2026-11-22T09:04:05Z");
    assert_eq!(iso8601_utc(4_107_542_399), "2100-02-28T23:59:59Z");
}

#[test]
fn results_table() {
    let p = &shapes();
    let t = format_results(&[
        rec("flashcore", &p[0], Mode::Graph, Some(9.5)),
        rec("flashcore", &p[2], Mode::Event, None),
    ]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].contains("median_us") && lines[0].contains("TFLOPS"));
    assert!(lines[1].contains("b1 h8 s512 d64") && lines[1].contains("9.50"));
    assert!(lines[2].contains("skipped: No available kernel"));
}

#[test]
fn compare_join() {
    let p = &shapes();
    let mut recs = vec![
        rec("flashcore", &p[0], Mode::Graph, Some(8.0)),
        rec("flashcore", &p[1], Mode::Graph, Some(300.0)),
        rec("flashcore", &p[1], Mode::Event, Some(310.0)),
    ];
    recs.extend([
        rec("sdpa-flash", &p[0], Mode::Graph, Some(10.0)),
        rec("sdpa-cudnn", &p[0], Mode::Graph, Some(9.0)),
        rec("sdpa-efficient", &p[0], Mode::Graph, None),
        rec("sdpa-cudnn", &p[1], Mode::Graph, Some(250.0)),
        rec("sdpa-flash", &p[2], Mode::Graph, Some(1000.0)),
    ]);
    // SDPA's records in the other layout still join (layout is not part of the key).
    let mut bhsd = rec(
        "sdpa-flash",
        &p[1].clone().layout(Layout::Bhsd),
        Mode::Graph,
        Some(400.0),
    );
    bhsd.shape.layout = Layout::Bhsd;
    recs.push(bhsd);
    let j = join(&recs, "flashcore");
    assert_eq!(
        j.columns,
        vec!["sdpa-cudnn", "sdpa-efficient", "sdpa-flash"]
    );
    assert_eq!(j.rows.len(), 4);
    let r0 = &j.rows[0];
    assert_eq!(r0.ours, Some(8.0));
    assert_eq!(r0.others, vec![Some(9.0), None, Some(10.0)]);
    assert_eq!(r0.best, Some(("sdpa-cudnn".to_string(), 9.0)));
    assert!((r0.ratio.unwrap() - 8.0 / 9.0).abs() < 1e-12);
    let r1 = &j.rows[1];
    assert_eq!(r1.others, vec![Some(250.0), None, Some(400.0)]);
    assert!((r1.ratio.unwrap() - 1.2).abs() < 1e-12);
    // Our event row has no counterpart.
    let r2 = &j.rows[2];
    assert_eq!(
        (r2.key.mode, r2.ours, r2.best.clone(), r2.ratio),
        (Mode::Event, Some(310.0), None, None)
    );
    // A shape only the others have comes last, without ours.
    let r3 = &j.rows[3];
    assert_eq!((r3.key.dtype, r3.ours, r3.ratio), (DType::Bf16, None, None));
    let text = format_join(&j);
    assert!(text.contains("sdpa-cudnn_us") && text.contains("ours/best"));
    assert!(text.contains("0.889"), "{text}");
    assert!(text.contains("1.200"), "{text}");
}

#[test]
fn plot_renders_png() {
    let mut recs = Vec::new();
    for (i, s) in [512usize, 1024, 2048, 4096, 8192, 16384]
        .into_iter()
        .enumerate()
    {
        for causal in [false, true] {
            let p = AttentionParams::new(16384 / s, 32, s, 64).causal(causal);
            recs.push(rec(
                "flashcore",
                &p,
                Mode::Graph,
                Some(100.0 + 10.0 * i as f64),
            ));
            recs.push(rec(
                "sdpa-cudnn",
                &p,
                Mode::Graph,
                Some(120.0 + 10.0 * i as f64),
            ));
            recs.push(rec("sdpa-flash", &p, Mode::Event, Some(150.0)));
        }
    }
    assert_eq!(plot::default_mode(&recs), Mode::Graph);
    let panels = plot::panels(&recs, Mode::Graph);
    assert_eq!(panels.len(), 2);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plot.png");
    plot::render(&recs, &path, None).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), (1040, 420));
    assert_eq!(&bytes[bytes.len() - 8..bytes.len() - 4], b"IEND");
    // Event mode has only sdpa-flash; nothing at all is an error.
    plot::render(&recs, &dir.path().join("e.png"), Some(Mode::Event)).unwrap();
    assert!(plot::render(&[], &dir.path().join("x.png"), None).is_err());
    assert_eq!(plot::seqlen_label(512.0), "512");
    assert_eq!(plot::seqlen_label(16384.0), "16k");
}

/// Backward records join only with backward records of the same shape (the pass is part of the
/// key); tables tag them; their FLOPs are 2.5× (backward) and 3.5× (forward+backward).
#[test]
fn passes_join_apart() {
    let p = &shapes();
    let pass = |imp: &str, pass: Pass, us: f64| Record {
        implementation: imp.to_string(),
        ..make_pass_record(&p[1], pass, Mode::Event, Ok(vec![us; 5]), None, None, env())
    };
    let recs = vec![
        pass("flashcore", Pass::Forward, 100.0),
        pass("flashcore", Pass::Backward, 300.0),
        pass("flashcore", Pass::ForwardBackward, 400.0),
        pass("sdpa-cudnn", Pass::Backward, 250.0),
        pass("sdpa-cudnn", Pass::Forward, 90.0),
    ];
    assert_eq!(recs[1].flops, 2.5 * p[1].flops());
    assert_eq!(recs[2].flops, 3.5 * p[1].flops());
    let j = join(&recs, "flashcore");
    assert_eq!(j.rows.len(), 3);
    let by_pass = |want: Pass| j.rows.iter().find(|r| r.key.pass == want).unwrap();
    assert_eq!(
        by_pass(Pass::Forward).best,
        Some(("sdpa-cudnn".to_string(), 90.0))
    );
    assert_eq!(
        by_pass(Pass::Backward).best,
        Some(("sdpa-cudnn".to_string(), 250.0))
    );
    assert_eq!(by_pass(Pass::ForwardBackward).best, None);
    let t = format_join(&j);
    assert!(t.contains("event bwd") && t.contains("event f+b"), "{t}");
    let t = format_results(&recs);
    assert!(t.lines().nth(2).unwrap().contains("event bwd"), "{t}");
    // A record without a pass (files from before --backward) reads as the forward.
    let mut v = serde_json::to_value(&recs[0]).unwrap();
    v.as_object_mut().unwrap().remove("pass");
    let r: Record = serde_json::from_value(v).unwrap();
    assert_eq!(r.pass, Pass::Forward);
    assert_eq!(
        serde_json::to_value(&recs[2]).unwrap()["pass"],
        "forward+backward"
    );
}
