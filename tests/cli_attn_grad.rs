//! `flashcore attn --grad` end to end: `--cpu` against the float64 reference gradients; every
//! error path (no `do`, `do` of the wrong dtype or shape, a KV-cache input, an unsupported
//! shape) exits 1 with a message naming the problem and writes nothing; the GPU path fails cleanly
//! without a GPU and matches the reference with one. `FLASHCORE_BIN` overrides the binary (for
//! running this test binary on a machine where the build directory does not exist).

mod common;

use common::{flashcore_attn, randn_data};
use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::reference::{self, check_close};
use flashcore::tensor_io::{read_file, write_file, Tensor, TensorData};
use rand::SeedableRng;
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Random q, k, v and do for `p`; `do` is replaced by `d_o` when given (`None` inside: omitted).
fn input_file(dir: &Path, p: &AttentionParams, seed: u64, d_o: Option<Option<Tensor>>) -> PathBuf {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let l = p.layout;
    let q_shape = l.shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim).to_vec();
    let kv_shape = l
        .shape(p.batch, p.seqlen_k, p.heads_kv, p.head_dim)
        .to_vec();
    let t = |shape: &Vec<usize>, r: &mut rand::rngs::StdRng, n| Tensor {
        shape: shape.clone(),
        data: randn_data(r, n, p.dtype),
    };
    let q = t(&q_shape, &mut r, p.q_len());
    let k = t(&kv_shape, &mut r, p.kv_len());
    let v = t(&kv_shape, &mut r, p.kv_len());
    let d_o = d_o.unwrap_or_else(|| Some(t(&q_shape, &mut r, p.q_len())));
    let path = dir.join("in.safetensors");
    let mut tensors = vec![("q", &q), ("k", &k), ("v", &v)];
    if let Some(d) = &d_o {
        tensors.push(("do", d));
    }
    write_file(&path, &tensors, None).unwrap();
    path
}

fn args_for<'a>(p: &AttentionParams, input: &'a Path, output: &'a Path) -> Vec<&'a str> {
    let mut a = vec![
        "--grad",
        "--lse",
        "--input",
        s(input),
        "--output",
        s(output),
        "--layout",
        p.layout.name(),
    ];
    if p.causal {
        a.push("--causal");
    }
    a
}

fn gqa(b: usize, sq: usize, sk: usize, hq: usize, hkv: usize, d: usize) -> AttentionParams {
    AttentionParams {
        heads_kv: hkv,
        ..AttentionParams::new(b, hq, sq, d).seqlen_k(sk)
    }
}

/// The written gradients against the reference computed from the file's own inputs.
fn check_against_reference(p: &AttentionParams, input: &Path, output: &Path, tol: f64) {
    let inp = read_file(input).unwrap();
    let f = |n: &str| inp[n].data.to_f64();
    let want = reference::attention_backward_f64(p, &f("q"), &f("k"), &f("v"), &f("do"));
    let fwd = reference::attention_f64(p, &f("q"), &f("k"), &f("v"));
    let got = read_file(output).unwrap();
    let q_shape = p
        .layout
        .shape(p.batch, p.seqlen_q, p.heads_q, p.head_dim)
        .to_vec();
    let k_shape = p
        .layout
        .shape(p.batch, p.seqlen_k, p.heads_kv, p.head_dim)
        .to_vec();
    for (name, shape, w) in [
        ("dq", &q_shape, &want.dq),
        ("dk", &k_shape, &want.dk),
        ("dv", &k_shape, &want.dv),
    ] {
        assert_eq!(&got[name].shape, shape, "{name}");
        let g = got[name].data.to_f64();
        let err = reference::rel_l2(&g, w);
        assert!(
            err <= tol,
            "{p:?}: {name} relative L2 {err:.3e} > {tol:.0e}"
        );
    }
    let err = reference::rel_l2(&got["out"].data.to_f64(), &fwd.out);
    assert!(err <= tol, "{p:?}: out relative L2 {err:.3e}");
    assert_eq!(got["lse"].shape, vec![p.batch, p.heads_q, p.seqlen_q]);
}

#[test]
fn cpu_grad_matches_reference_and_writes_f32() {
    for (seed, p) in [
        gqa(2, 17, 17, 3, 3, 64),
        gqa(1, 12, 7, 4, 2, 128)
            .causal(true)
            .layout(Layout::Bhsd)
            .dtype(DType::Bf16),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = tempfile::tempdir().unwrap();
        let input = input_file(dir.path(), &p, seed as u64, None);
        let output = dir.path().join("out.safetensors");
        let mut args = args_for(&p, &input, &output);
        args.push("--cpu");
        let run = flashcore_attn(&args);
        assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
        assert!(
            run.stdout.contains("cpu f64 reference") && run.stdout.contains("dq"),
            "{}",
            run.stdout
        );
        let got = read_file(&output).unwrap();
        for n in ["out", "dq", "dk", "dv", "lse"] {
            assert!(
                matches!(got[n].data, TensorData::F32(_)),
                "--cpu writes F32 ({n})"
            );
        }
        // The file holds the reference's values (to f32 rounding).
        let inp = read_file(&input).unwrap();
        let f = |n: &str| inp[n].data.to_f64();
        let want = reference::attention_backward_f64(&p, &f("q"), &f("k"), &f("v"), &f("do"));
        check_close("dq", &got["dq"].data.to_f64(), &want.dq, 1e-6).unwrap();
        check_close("dk", &got["dk"].data.to_f64(), &want.dk, 1e-6).unwrap();
        check_close("dv", &got["dv"].data.to_f64(), &want.dv, 1e-6).unwrap();
        check_against_reference(&p, &input, &output, 1e-6);
    }
}

/// Runs `--grad --cpu` on an input and expects exit 1, every `needles` in stderr, no output file.
fn expect_error(p: &AttentionParams, input: &Path, dir: &Path, needles: &[&str]) {
    let output = dir.join("out.safetensors");
    let mut args = args_for(p, input, &output);
    args.push("--cpu");
    let run = flashcore_attn(&args);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    for n in needles {
        assert!(run.stderr.contains(n), "missing `{n}` in: {}", run.stderr);
    }
    assert!(!output.exists(), "an output file was written on error");
}

#[test]
fn missing_do_is_an_error_that_lists_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let input = input_file(dir.path(), &p, 1, Some(None));
    expect_error(
        &p,
        &input,
        dir.path(),
        &["`do`", "output gradient", "it holds k, q, v"],
    );
}

#[test]
fn do_of_the_wrong_dtype_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    let d_o = Tensor {
        shape: p.layout.shape(1, 8, 2, 64).to_vec(),
        data: randn_data(&mut r, p.q_len(), DType::Bf16),
    };
    let input = input_file(dir.path(), &p, 1, Some(Some(d_o)));
    expect_error(
        &p,
        &input,
        dir.path(),
        &["`do` has dtype BF16", "`q` has F16"],
    );
}

#[test]
fn do_of_the_wrong_shape_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let mut r = rand::rngs::StdRng::seed_from_u64(4);
    let d_o = Tensor {
        shape: vec![1, 7, 2, 64],
        data: randn_data(&mut r, 7 * 2 * 64, DType::F16),
    };
    let input = input_file(dir.path(), &p, 1, Some(Some(d_o)));
    expect_error(
        &p,
        &input,
        dir.path(),
        &["`do` has shape [1, 7, 2, 64]", "[1, 8, 2, 64]"],
    );
}

#[test]
fn unsupported_shape_is_an_error_naming_the_inferred_shape() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 80);
    let input = input_file(dir.path(), &p, 1, None);
    expect_error(&p, &input, dir.path(), &["head_dim", "D=80"]);
}

#[test]
fn kv_cache_input_has_no_backward() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let mut r = rand::rngs::StdRng::seed_from_u64(5);
    let t = |shape: Vec<usize>, r: &mut rand::rngs::StdRng| Tensor {
        data: randn_data(r, shape.iter().product(), DType::F16),
        shape,
    };
    let q = t(vec![1, 1, 2, 64], &mut r);
    let kc = t(vec![1, 8, 2, 64], &mut r);
    let vc = t(vec![1, 8, 2, 64], &mut r);
    let input = dir.path().join("in.safetensors");
    write_file(
        &input,
        &[("q", &q), ("k_cache", &kc), ("v_cache", &vc)],
        None,
    )
    .unwrap();
    expect_error(&p, &input, dir.path(), &["--grad", "KV-cache"]);
}

/// Without a usable GPU: exit 1 with the typed "no CUDA driver/device" message and no output.
/// With one: the gradients (input dtype) match the reference.
#[test]
fn gpu_grad_fails_cleanly_without_a_gpu_and_matches_reference_with_one() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    if let Err(e) = flashcore::attention::Context::new(0) {
        let p = AttentionParams::new(1, 2, 8, 64);
        let input = input_file(dir.path(), &p, 9, None);
        let run = flashcore_attn(&args_for(&p, &input, &output));
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert!(
            run.stderr.contains("no CUDA driver")
                || run.stderr.contains("no CUDA device")
                || run.stderr.contains("unsupported device"),
            "{}",
            run.stderr
        );
        assert!(!output.exists());
        if std::env::var("FLASHCORE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FLASHCORE_REQUIRE_GPU=1 but no usable GPU: {e}");
        }
        return;
    }
    for (seed, (p, tol)) in [
        (gqa(2, 77, 130, 4, 2, 64), 2e-3),
        (
            gqa(1, 129, 50, 2, 2, 128)
                .layout(Layout::Bhsd)
                .dtype(DType::Bf16)
                .causal(true),
            1e-2,
        ),
        // Head dims 96 and 256.
        (gqa(1, 100, 77, 4, 1, 96).causal(true), 2e-3),
        (gqa(2, 33, 140, 2, 2, 256).dtype(DType::Bf16), 1e-2),
    ]
    .into_iter()
    .enumerate()
    {
        let input = input_file(dir.path(), &p, 20 + seed as u64, None);
        let run = flashcore_attn(&args_for(&p, &input, &output));
        assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
        let got = read_file(&output).unwrap();
        let want_dtype = if p.dtype == DType::F16 { "F16" } else { "BF16" };
        assert_eq!(got["dq"].data.dtype_name(), want_dtype);
        check_against_reference(&p, &input, &output, tol);
    }
}

// --- windows, softcap and sinks in the backward ---------------------------------------

/// `input_file` plus learnable sinks (F32 [Hq]) when `sinks` is given.
fn feature_input(dir: &Path, p: &AttentionParams, seed: u64, sinks: Option<&[f32]>) -> PathBuf {
    let path = input_file(dir, p, seed, None);
    if let Some(s) = sinks {
        let mut all = read_file(&path).unwrap();
        let t = Tensor {
            shape: vec![s.len()],
            data: TensorData::F32(s.to_vec()),
        };
        all.insert("sinks".into(), t);
        let tensors: Vec<(&str, &Tensor)> = all.iter().map(|(n, t)| (n.as_str(), t)).collect();
        write_file(&path, &tensors, None).unwrap();
    }
    path
}

/// The CLI arguments of `p`'s window and softcap.
fn feature_args(p: &AttentionParams) -> Vec<String> {
    let (l, r) = p.window.to_flash_attn();
    let mut a = Vec::new();
    if !p.window.is_unbounded() {
        a.extend(["--window".to_string(), format!("{l},{r}")]);
    }
    if p.softcap != 0.0 {
        a.extend(["--softcap".to_string(), p.softcap.to_string()]);
    }
    a
}

/// The written gradients (and dsink) against the reference with the same features.
fn check_features(
    p: &AttentionParams,
    input: &Path,
    output: &Path,
    sinks: Option<&[f32]>,
    tol: f64,
) {
    let inp = read_file(input).unwrap();
    let f = |n: &str| inp[n].data.to_f64();
    let s64: Option<Vec<f64>> = sinks.map(|s| s.iter().map(|&x| x as f64).collect());
    let (want, want_dsink) = reference::attention_backward_f64_sinks(
        p,
        &f("q"),
        &f("k"),
        &f("v"),
        &f("do"),
        s64.as_deref(),
    );
    let got = read_file(output).unwrap();
    for (name, w) in [("dq", &want.dq), ("dk", &want.dk), ("dv", &want.dv)] {
        let err = reference::rel_l2(&got[name].data.to_f64(), w);
        assert!(
            err <= tol,
            "{p:?}: {name} relative L2 {err:.3e} > {tol:.0e}"
        );
    }
    match sinks {
        Some(_) => {
            assert_eq!(got["dsink"].shape, vec![p.heads_q]);
            assert!(matches!(got["dsink"].data, TensorData::F32(_)));
            let err = reference::rel_l2(&got["dsink"].data.to_f64(), &want_dsink);
            assert!(err <= tol, "{p:?}: dsink relative L2 {err:.3e} > {tol:.0e}");
        }
        None => assert!(!got.contains_key("dsink"), "dsink written without sinks"),
    }
}

fn feature_cases() -> Vec<(AttentionParams, Option<Vec<f32>>)> {
    use flashcore::attention::Window;
    vec![
        (
            gqa(2, 40, 60, 4, 2, 64)
                .window(Window::from_flash_attn(8, 4))
                .softcap(2.0),
            None,
        ),
        (
            gqa(1, 70, 50, 2, 2, 128)
                .causal(true)
                .window(Window::from_flash_attn(16, -1))
                .dtype(DType::Bf16),
            Some(vec![0.5, -1.0]),
        ),
    ]
}

#[test]
fn cpu_grad_with_window_softcap_and_sinks_matches_reference() {
    for (seed, (p, sinks)) in feature_cases().into_iter().enumerate() {
        let dir = tempfile::tempdir().unwrap();
        let input = feature_input(dir.path(), &p, 40 + seed as u64, sinks.as_deref());
        let output = dir.path().join("out.safetensors");
        let extra = feature_args(&p);
        let mut args = args_for(&p, &input, &output);
        args.extend(extra.iter().map(|s| s.as_str()));
        args.push("--cpu");
        let run = flashcore_attn(&args);
        assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
        if sinks.is_some() {
            assert!(
                run.stdout.contains("dsink") && run.stdout.contains("sinks"),
                "{}",
                run.stdout
            );
        }
        check_features(&p, &input, &output, sinks.as_deref(), 1e-6);
    }
}

/// Sinks of the wrong length: exit 1 naming the tensor, nothing written.
#[test]
fn grad_with_sinks_of_the_wrong_length_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = AttentionParams::new(1, 2, 8, 64);
    let input = feature_input(dir.path(), &p, 3, Some(&[0.0, 1.0, 2.0]));
    expect_error(&p, &input, dir.path(), &["sinks", "one per query head"]);
}

/// With a GPU: the features' gradients (and dsink) match the reference; the one-pass kernel
/// (FLASHCORE_BWD_ONEPASS=1) refuses a window with a message saying what to do. Without one the
/// CPU tests above cover the CLI.
#[test]
fn gpu_grad_with_features_matches_reference_and_one_pass_refuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    if let Err(e) = flashcore::attention::Context::new(0) {
        if std::env::var("FLASHCORE_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("FLASHCORE_REQUIRE_GPU=1 but no usable GPU: {e}");
        }
        eprintln!("SKIPPED gpu_grad_with_features_matches_reference_and_one_pass_refuses_them: no usable GPU ({e})");
        return;
    }
    for (seed, (p, sinks)) in feature_cases().into_iter().enumerate() {
        let input = feature_input(dir.path(), &p, 50 + seed as u64, sinks.as_deref());
        let extra = feature_args(&p);
        let mut args = args_for(&p, &input, &output);
        args.extend(extra.iter().map(|s| s.as_str()));
        let run = flashcore_attn(&args);
        assert_eq!(run.code, 0, "{p:?}\n{}", run.stderr);
        let tol = if p.dtype == DType::F16 { 2e-3 } else { 1e-2 };
        check_features(&p, &input, &output, sinks.as_deref(), tol);
    }
    let (p, _) = feature_cases().remove(0);
    let input = feature_input(dir.path(), &p, 60, None);
    let _ = std::fs::remove_file(&output);
    let extra = feature_args(&p);
    let mut args = vec!["attn".to_string()];
    args.extend(args_for(&p, &input, &output).iter().map(|s| s.to_string()));
    args.extend(extra);
    let bin = std::env::var("FLASHCORE_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_flashcore").to_string());
    let o = std::process::Command::new(bin)
        .args(&args)
        .env("FLASHCORE_BWD_ONEPASS", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("one-pass") && stderr.contains("FLASHCORE_BWD_ONEPASS"),
        "{stderr}"
    );
    assert!(!output.exists());
}
