//! `flashcore attn` end to end: `--cpu` on files written here, checked against the reference;
//! exit codes and messages of the error paths; the GPU path on a machine without one.

mod common;

use common::{flashcore_attn, randn_data};
use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::reference::{self, check_close};
use flashcore::tensor_io::{read_attn_input, read_file, write_file, Tensor, TensorData};
use half::f16;
use rand::SeedableRng;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Writes random q, k, v for `p` (its dtype and layout) and returns the path.
fn input_file(dir: &Path, name: &str, p: &AttentionParams, seed: u64) -> PathBuf {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let l = p.layout;
    let q = Tensor {
        shape: l.shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim).to_vec(),
        data: randn_data(&mut r, p.q_len(), p.dtype),
    };
    let kv_shape = l
        .shape(p.batch, p.seqlen_k, p.heads_kv, p.head_dim)
        .to_vec();
    let k = Tensor {
        shape: kv_shape.clone(),
        data: randn_data(&mut r, p.kv_len(), p.dtype),
    };
    let v = Tensor {
        shape: kv_shape,
        data: randn_data(&mut r, p.kv_len(), p.dtype),
    };
    let path = dir.join(name);
    write_file(&path, &[("q", &q), ("k", &k), ("v", &v)], None).unwrap();
    path
}

fn gqa(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttentionParams {
    AttentionParams {
        heads_kv: hkv,
        ..AttentionParams::new(b, hq, sq, d).seqlen_k(sk)
    }
}

/// Runs `--cpu` on random inputs for `p` and checks `out` and `lse` against the reference.
fn cpu_end_to_end(p: &AttentionParams, extra: &[&str], seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let input = input_file(dir.path(), "in.safetensors", p, seed);
    let output = dir.path().join("out.safetensors");
    let mut args = vec![
        "--cpu",
        "--lse",
        "--input",
        s(&input),
        "--output",
        s(&output),
        "--layout",
        p.layout.name(),
    ];
    if p.causal {
        args.push("--causal");
    }
    args.extend(extra);
    let run = flashcore_attn(&args);
    assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
    assert!(run.stdout.contains("cpu f64 reference"), "{}", run.stdout);

    let inp = read_attn_input(&input, p.layout).unwrap();
    let want = reference::attention_f64(p, &inp.q.to_f64(), &inp.k.to_f64(), &inp.v.to_f64());
    let got = read_file(&output).unwrap();
    let out = &got["out"];
    assert_eq!(
        out.shape,
        p.layout
            .shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim)
            .to_vec()
    );
    assert!(matches!(out.data, TensorData::F32(_)), "--cpu writes F32");
    check_close("out", &out.data.to_f64(), &want.out, 1e-6).unwrap();
    let lse = &got["lse"];
    assert_eq!(lse.shape, vec![p.batch, p.heads_q, p.seqlen_q]);
    check_close("lse", &lse.data.to_f64(), &want.lse, 1e-6).unwrap();
}

#[test]
fn cpu_bshd_f16_matches_reference() {
    cpu_end_to_end(&AttentionParams::new(2, 3, 17, 64), &[], 1);
}

#[test]
fn cpu_bhsd_bf16_causal_gqa_with_scale() {
    let mut p = gqa(1, 9, 20, 4, 2, 128)
        .layout(Layout::Bhsd)
        .dtype(DType::Bf16)
        .causal(true);
    p.scale = Some(0.3);
    cpu_end_to_end(&p, &["--scale", "0.3"], 2);
}

#[test]
fn cpu_causal_sq_greater_than_sk_has_masked_rows() {
    // Rows 0..5 are fully masked: out 0 and lse −inf, which check_close matches exactly.
    cpu_end_to_end(&gqa(1, 12, 7, 2, 1, 64).causal(true), &[], 3);
}

#[test]
fn scale_changes_the_result() {
    // Guards against --scale being ignored: the default-scale run must not match scale 0.3.
    let p = AttentionParams::new(1, 2, 8, 64);
    let dir = tempfile::tempdir().unwrap();
    let input = input_file(dir.path(), "in", &p, 4);
    let out = dir.path().join("out");
    let run = flashcore_attn(&[
        "--cpu",
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--scale",
        "0.3",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let inp = read_attn_input(&input, Layout::Bshd).unwrap();
    let (q, k, v) = (inp.q.to_f64(), inp.k.to_f64(), inp.v.to_f64());
    let got = read_file(&out).unwrap()["out"].data.to_f64();
    check_close(
        "out",
        &got,
        &reference::attention_f64(&p.clone().scale(0.3), &q, &k, &v).out,
        1e-6,
    )
    .unwrap();
    assert!(check_close(
        "out",
        &got,
        &reference::attention_f64(&p, &q, &k, &v).out,
        1e-3
    )
    .is_err());
    assert!(
        !read_file(&out).unwrap().contains_key("lse"),
        "no --lse, no lse tensor"
    );
}

/// Runs with `args` and expects exit `code` and `needles` in stderr.
fn expect_failure(args: &[&str], code: i32, needles: &[&str]) {
    let run = flashcore_attn(args);
    assert_eq!(run.code, code, "args {args:?}\nstderr: {}", run.stderr);
    for n in needles {
        assert!(
            run.stderr.contains(n),
            "args {args:?}: stderr lacks `{n}`:\n{}",
            run.stderr
        );
    }
}

#[test]
fn runtime_errors_exit_1_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out");
    let o = s(&out);

    let missing = d.join("missing.safetensors");
    expect_failure(
        &["--cpu", "--input", s(&missing), "--output", o],
        1,
        &["flashcore: error:", "missing.safetensors", "cannot read"],
    );

    let garbage = d.join("garbage");
    std::fs::write(&garbage, b"this is not a safetensors file at all").unwrap();
    expect_failure(
        &["--cpu", "--input", s(&garbage), "--output", o],
        1,
        &["not a safetensors file"],
    );

    let sh = [1, 4, 2, 64];
    let x = Tensor {
        shape: sh.to_vec(),
        data: TensorData::F16(vec![f16::ONE; 512]),
    };
    let wrong_name = d.join("wrong_name");
    write_file(&wrong_name, &[("query", &x), ("k", &x), ("v", &x)], None).unwrap();
    expect_failure(
        &["--cpu", "--input", s(&wrong_name), "--output", o],
        1,
        &["no tensor named `q`"],
    );

    let wrong_dtype = d.join("wrong_dtype");
    let y = Tensor {
        shape: sh.to_vec(),
        data: TensorData::F32(vec![1.0; 512]),
    };
    write_file(&wrong_dtype, &[("q", &x), ("k", &y), ("v", &x)], None).unwrap();
    expect_failure(
        &["--cpu", "--input", s(&wrong_dtype), "--output", o],
        1,
        &["`k`", "F32"],
    );

    let wrong_shape = d.join("wrong_shape");
    let z = Tensor {
        shape: vec![1, 8, 64],
        data: TensorData::F16(vec![f16::ONE; 512]),
    };
    write_file(&wrong_shape, &[("q", &x), ("k", &x), ("v", &z)], None).unwrap();
    expect_failure(
        &["--cpu", "--input", s(&wrong_shape), "--output", o],
        1,
        &["`v`", "rank 3"],
    );

    // Well-formed file, but a head dim the kernels do not support: check_params rejects it.
    let d32 = input_file(d, "d32", &AttentionParams::new(1, 2, 4, 32), 5);
    expect_failure(
        &["--cpu", "--input", s(&d32), "--output", o],
        1,
        &["head_dim", "32"],
    );

    // Hq not a multiple of Hkv.
    let h3 = input_file(d, "h3", &gqa(1, 4, 4, 3, 2, 64), 6);
    expect_failure(
        &["--cpu", "--input", s(&h3), "--output", o],
        1,
        &[
            "heads_kv",
            "multiple",
            "as bshd: B=1 Sq=4 Sk=4 Hq=3 Hkv=2 D=64",
        ],
    );

    // Unwritable output.
    let good = input_file(d, "good", &AttentionParams::new(1, 1, 4, 64), 7);
    let bad_out = d.join("no/such/dir/out");
    expect_failure(
        &["--cpu", "--input", s(&good), "--output", s(&bad_out)],
        1,
        &["no/such/dir/out"],
    );
    assert!(!out.exists(), "no output is written on failure");
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let input = input_file(dir.path(), "in", &AttentionParams::new(1, 1, 4, 64), 8);
    let (i, o) = (s(&input), dir.path().join("out"));
    let o = s(&o);
    expect_failure(&["--cpu", "--output", o], 2, &["--input"]);
    expect_failure(&["--cpu", "--input", i], 2, &["--output"]);
    expect_failure(
        &["--cpu", "--input", i, "--output", o, "--layout", "sbhd"],
        2,
        &["sbhd", "bshd or bhsd"],
    );
    for bad in ["-1", "0", "nan", "inf", "abc"] {
        expect_failure(
            &["--cpu", "--input", i, "--output", o, "--scale", bad],
            2,
            &["--scale"],
        );
    }
    expect_failure(
        &["--cpu", "--device", "1", "--input", i, "--output", o],
        2,
        &["--device"],
    );
}

/// Without a usable GPU: exit 1 with the typed "no CUDA driver/device" message, no panic,
/// no output file. With one: the output (input dtype) and LSE match the reference, fully
/// masked rows included.
#[test]
fn gpu_path_fails_cleanly_without_a_gpu_and_matches_reference_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    if let Err(e) = flashcore::attention::Context::new(0) {
        let input = input_file(dir.path(), "in", &AttentionParams::new(1, 2, 8, 64), 9);
        let run = flashcore_attn(&["--input", s(&input), "--output", s(&out), "--lse"]);
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert!(
            run.stderr.contains("flashcore: error:")
                && (run.stderr.contains("no CUDA driver")
                    || run.stderr.contains("no CUDA device")
                    || run.stderr.contains("unsupported device")),
            "{}",
            run.stderr
        );
        // The message says what to do instead, once.
        assert_eq!(run.stderr.matches("--cpu").count(), 1, "{}", run.stderr);
        assert!(!out.exists());
        if std::env::var("FLASHCORE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FLASHCORE_REQUIRE_GPU=1 but no usable GPU: {e}");
        }
        return;
    }
    let cases = [
        (gqa(2, 77, 130, 4, 2, 64), 2e-3),
        (
            gqa(1, 129, 50, 2, 2, 128)
                .layout(Layout::Bhsd)
                .dtype(DType::Bf16)
                .causal(true),
            1e-2,
        ),
    ];
    for (seed, (p, tol)) in cases.into_iter().enumerate() {
        let input = input_file(dir.path(), "in", &p, 20 + seed as u64);
        let mut args = vec!["--lse", "--input", s(&input), "--output", s(&out)];
        args.extend(["--layout", p.layout.name()]);
        if p.causal {
            args.push("--causal");
        }
        let run = flashcore_attn(&args);
        assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
        let inp = read_attn_input(&input, p.layout).unwrap();
        let want = reference::attention_f64(&p, &inp.q.to_f64(), &inp.k.to_f64(), &inp.v.to_f64());
        let got = read_file(&out).unwrap();
        assert_eq!(
            got["out"].data.attention_dtype(),
            Some(p.dtype),
            "GPU writes the input dtype"
        );
        check_close("out", &got["out"].data.to_f64(), &want.out, tol)
            .unwrap_or_else(|e| panic!("{p:?}: {e}"));
        check_close("lse", &got["lse"].data.to_f64(), &want.lse, 1e-3)
            .unwrap_or_else(|e| panic!("{p:?}: {e}"));
    }
}

#[test]
fn output_that_is_the_input_is_refused_and_the_input_survives() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 17, 64);
    let input = input_file(dir.path(), "qkv.safetensors", &p, 11);
    let before = std::fs::read(&input).unwrap();
    // The same path, a symbolic link to it, and a hard link to it.
    let sym = dir.path().join("sym.safetensors");
    let hard = dir.path().join("hard.safetensors");
    std::os::unix::fs::symlink(&input, &sym).unwrap();
    std::fs::hard_link(&input, &hard).unwrap();
    for out in [&input, &sym, &hard] {
        let r = flashcore_attn(&["--cpu", "--input", s(&input), "--output", s(out)]);
        assert_eq!(r.code, 1, "output {out:?}: {}", r.stderr);
        assert!(
            r.stderr.contains("is the input file"),
            "output {out:?}: {}",
            r.stderr
        );
        assert_eq!(std::fs::read(&input).unwrap(), before, "input changed");
    }
}

#[test]
fn output_replaces_an_existing_file_whole_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 17, 64);
    let input = input_file(dir.path(), "qkv.safetensors", &p, 12);
    let out = dir.path().join("out.safetensors");
    std::fs::write(&out, b"an older result").unwrap();
    let r = flashcore_attn(&["--cpu", "--input", s(&input), "--output", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(read_file(&out).unwrap().contains_key("out"));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".flashcore-tmp-")),
        "temporary left behind: {names:?}"
    );
}

#[test]
fn non_finite_inputs_are_warned_about_with_their_count() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 9, 64);
    let clean = input_file(dir.path(), "clean.safetensors", &p, 13);
    let mut t = read_file(&clean).unwrap();
    if let TensorData::F16(v) = &mut t.get_mut("k").unwrap().data {
        v[3] = f16::NAN;
        v[7] = f16::INFINITY;
        v[8] = f16::NEG_INFINITY;
    } else {
        panic!("input_file writes f16 for an f16 shape");
    }
    let dirty = dir.path().join("dirty.safetensors");
    write_file(
        &dirty,
        &[("q", &t["q"]), ("k", &t["k"]), ("v", &t["v"])],
        None,
    )
    .unwrap();
    let out = dir.path().join("out.safetensors");
    let r = flashcore_attn(&["--cpu", "--input", s(&dirty), "--output", s(&out)]);
    assert_eq!(r.code, 0, "a warning, not an error: {}", r.stderr);
    assert!(
        r.stderr.contains("warning: `k`") && r.stderr.contains("holds 3 NaN/Inf"),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("`q`") && !r.stderr.contains("`v`"),
        "{}",
        r.stderr
    );
    let r = flashcore_attn(&["--cpu", "--input", s(&clean), "--output", s(&out)]);
    assert_eq!(r.code, 0);
    assert!(!r.stderr.contains("warning"), "{}", r.stderr);
}

/// The flags: `--window L,R` and `--softcap X` on the CPU reference, sinks read from the
/// input file (`sinks`, F32 [Hq]); each bad value a usage or runtime error. With a GPU, the same
/// file through the kernel matches the reference.
#[test]
fn window_softcap_and_sinks_flags() {
    use flashcore::attention::Window;
    let dir = tempfile::tempdir().unwrap();
    let p = gqa(1, 40, 60, 4, 2, 64)
        .causal(true)
        .window(Window::from_flash_attn(7, -1))
        .softcap(5.0);
    let input = input_file(dir.path(), "in", &p, 31);
    // Add the sinks to the same file.
    let mut all = read_file(&input).unwrap();
    let sinks = Tensor {
        shape: vec![4],
        data: TensorData::F32(vec![0.5, -1.0, 2.0, -30.0]),
    };
    all.insert("sinks".into(), sinks);
    let named: Vec<(&str, &Tensor)> = all.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let with_sinks = dir.path().join("in_sinks");
    write_file(&with_sinks, &named, None).unwrap();
    let out = dir.path().join("out");
    let inp = read_attn_input(&input, p.layout).unwrap();
    let sinks64 = [0.5, -1.0, 2.0, -30.0];
    let want = reference::attention_f64_sinks(
        &p,
        &inp.q.to_f64(),
        &inp.k.to_f64(),
        &inp.v.to_f64(),
        Some(&sinks64),
    );
    let base = [
        "--lse",
        "--causal",
        "--window",
        "7,-1",
        "--softcap",
        "5",
        "--input",
        s(&with_sinks),
        "--output",
        s(&out),
    ];
    let mut cpu = vec!["--cpu"];
    cpu.extend(base);
    let run = flashcore_attn(&cpu);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains("window=7,-1") && run.stdout.contains("softcap=5"),
        "{}",
        run.stdout
    );
    let got = read_file(&out).unwrap();
    check_close("out", &got["out"].data.to_f64(), &want.out, 1e-6).unwrap();
    check_close("lse", &got["lse"].data.to_f64(), &want.lse, 1e-6).unwrap();
    if flashcore::attention::Context::new(0).is_ok() {
        let run = flashcore_attn(&base);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let got = read_file(&out).unwrap();
        check_close("out", &got["out"].data.to_f64(), &want.out, 2e-3).unwrap();
        check_close("lse", &got["lse"].data.to_f64(), &want.lse, 1e-3).unwrap();
    }

    let (i, o) = (s(&input), s(&out));
    for bad in ["1", "1,2,3", "-2,0", "a,1"] {
        expect_failure(
            &["--cpu", "--input", i, "--output", o, "--window", bad],
            2,
            &["--window"],
        );
    }
    for bad in ["-1", "nan", "inf"] {
        expect_failure(
            &["--cpu", "--input", i, "--output", o, "--softcap", bad],
            2,
            &["--softcap"],
        );
    }
    // Sinks of the wrong count or dtype; features with --grad (taken by the backward:
    // tests/cli_attn_grad.rs; this file has no `do`, and that is the error).
    let bad_sinks = Tensor {
        shape: vec![3],
        data: TensorData::F32(vec![0.0; 3]),
    };
    let mut all = read_file(&input).unwrap();
    all.insert("sinks".into(), bad_sinks);
    let named: Vec<(&str, &Tensor)> = all.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let three = dir.path().join("in_three");
    write_file(&three, &named, None).unwrap();
    expect_failure(
        &["--cpu", "--input", s(&three), "--output", o],
        1,
        &["sinks", "one per query head"],
    );
    expect_failure(
        &["--cpu", "--grad", "--input", s(&with_sinks), "--output", o],
        1,
        &["--grad needs the output gradient `do`"],
    );
}
