//! `flashcore attn` on a packed varlen input file (`cu_seqlens_q`, `cu_seqlens_k` beside q, k, v
//! `[total, H, D]`): `--cpu` against the per-sequence reference computed here, each
//! bad-metadata error before any launch, and the GPU against `--cpu` (skipped visibly without a
//! GPU).

mod common;

use flashcore::attention::{AttentionParams, DType, Layout};
use flashcore::reference;
use flashcore::tensor_io::read_file;
use half::bf16;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;
const LQ: [usize; 5] = [1, 17, 0, 129, 40];
const LK: [usize; 5] = [3, 17, 5, 128, 300];

fn prefix(l: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &x in l {
        cu.push(cu.last().unwrap() + x as i32);
    }
    cu
}

fn bf16s(r: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(r.random_range(-2.0f32..2.0)))
        .collect()
}

fn bytes_of(x: &[bf16]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
}

fn i32_bytes(x: &[i32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

struct Case {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
}

fn case(seed: u64) -> Case {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let (tq, tk) = (LQ.iter().sum::<usize>(), LK.iter().sum::<usize>());
    Case {
        q: bf16s(&mut r, tq * HQ * D),
        k: bf16s(&mut r, tk * HKV * D),
        v: bf16s(&mut r, tk * HKV * D),
    }
}

/// Writes the case; `extra` replaces or adds entries, `skip` leaves names out.
fn write(
    dir: &Path,
    c: &Case,
    extra: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>,
    skip: &[&str],
) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "vl{}.safetensors",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let (tq, tk) = (LQ.iter().sum::<usize>(), LK.iter().sum::<usize>());
    let mut entries: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![
        ("q", Dtype::BF16, vec![tq, HQ, D], bytes_of(&c.q)),
        ("k", Dtype::BF16, vec![tk, HKV, D], bytes_of(&c.k)),
        ("v", Dtype::BF16, vec![tk, HKV, D], bytes_of(&c.v)),
        (
            "cu_seqlens_q",
            Dtype::I32,
            vec![LQ.len() + 1],
            i32_bytes(&prefix(&LQ)),
        ),
        (
            "cu_seqlens_k",
            Dtype::I32,
            vec![LK.len() + 1],
            i32_bytes(&prefix(&LK)),
        ),
    ];
    entries.retain(|e| !skip.contains(&e.0) && !extra.iter().any(|x| x.0 == e.0));
    entries.extend(extra);
    let views: Vec<(&str, TensorView)> = entries
        .iter()
        .map(|(n, dt, shape, bytes)| (*n, TensorView::new(*dt, shape.clone(), bytes).unwrap()))
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    path
}

fn run(input: &Path, output: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec![
        "--lse",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let r = common::flashcore_attn(&args);
    (r.code, r.stdout, r.stderr)
}

#[test]
fn cpu_matches_the_per_sequence_reference() {
    let dir = tempfile::tempdir().unwrap();
    for causal in [false, true] {
        let c = case(5 + causal as u64);
        let input = write(dir.path(), &c, vec![], &[]);
        let output = dir.path().join("out.safetensors");
        let mut extra = vec!["--cpu"];
        if causal {
            extra.push("--causal");
        }
        let (code, stdout, stderr) = run(&input, &output, &extra);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(stdout.contains("varlen B=5"), "{stdout}");
        let p = AttentionParams {
            batch: LQ.len(),
            seqlen_q: 129,
            seqlen_k: 300,
            heads_q: HQ,
            heads_kv: HKV,
            head_dim: D,
            dtype: DType::Bf16,
            layout: Layout::Bshd,
            causal,
            scale: None,
            window: Default::default(),
            softcap: 0.0,
        };
        let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
        let want =
            reference::varlen_f64(&p, &prefix(&LQ), &prefix(&LK), &f(&c.q), &f(&c.k), &f(&c.v));
        let t = read_file(&output).unwrap();
        let err = reference::rel_l2(&t["out"].data.to_f64(), &want.out);
        assert!(err < 1e-6, "causal {causal}: {err:.2e}");
        let tq = LQ.iter().sum::<usize>();
        assert_eq!(t["out"].shape, vec![tq, HQ, D]);
        assert_eq!(t["lse"].shape, vec![HQ, tq]);
    }
}

#[test]
fn bad_varlen_inputs_are_errors_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(1);
    let output = dir.path().join("out.safetensors");
    let n = LQ.len() + 1;
    let mut bad_order = prefix(&LQ);
    bad_order.swap(1, 2);
    let mut bad_last = prefix(&LK);
    *bad_last.last_mut().unwrap() -= 1;
    let cases: Vec<(PathBuf, &[&str], &str)> = vec![
        (
            write(dir.path(), &c, vec![], &["cu_seqlens_k"]),
            &[],
            "cu_seqlens_k",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![("cu_seqlens_q", Dtype::F32, vec![n], vec![0; 4 * n])],
                &[],
            ),
            &[],
            "expected I32",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![("cu_seqlens_q", Dtype::I32, vec![n], i32_bytes(&bad_order))],
                &[],
            ),
            &[],
            "non-decreasing",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![("cu_seqlens_k", Dtype::I32, vec![n], i32_bytes(&bad_last))],
                &[],
            ),
            &[],
            "last entry",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![(
                    "cu_seqlens_k",
                    Dtype::I32,
                    vec![n - 1],
                    i32_bytes(&prefix(&LK[1..])),
                )],
                &[],
            ),
            &[],
            "batch + 1",
        ),
        (
            write(dir.path(), &c, vec![], &[]),
            &["--layout", "bhsd"],
            "bshd",
        ),
    ];
    for (input, extra, message) in cases {
        let mut args = vec!["--cpu"];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&input, &output, &args);
        assert_eq!(code, 1, "{message}: {stdout}\n{stderr}");
        assert!(
            stderr.contains(message),
            "expected `{message}` in: {stderr}"
        );
        assert!(!output.exists() || std::fs::remove_file(&output).is_ok());
    }
}

#[test]
fn gpu_matches_cpu() {
    let Some(_ctx) = common::gpu("gpu_matches_cpu") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let input = write(dir.path(), &case(3), vec![], &[]);
    let (g, w) = (
        dir.path().join("gpu.safetensors"),
        dir.path().join("cpu.safetensors"),
    );
    let (code, so, se) = run(&input, &g, &["--causal"]);
    assert_eq!(code, 0, "{so}\n{se}");
    let (code, so, se) = run(&input, &w, &["--causal", "--cpu"]);
    assert_eq!(code, 0, "{so}\n{se}");
    let (g, w) = (read_file(&g).unwrap(), read_file(&w).unwrap());
    let err = reference::rel_l2(&g["out"].data.to_f64(), &w["out"].data.to_f64());
    assert!(err < 1e-2, "GPU vs CPU: {err:.2e}");
    // Rows that see no key (causal, 129 queries over 128 keys: the first) are −inf in both.
    let (gl, wl) = (g["lse"].data.to_f64(), w["lse"].data.to_f64());
    let inf = |x: &[f64]| x.iter().map(|v| v.is_infinite()).collect::<Vec<bool>>();
    assert_eq!(inf(&gl), inf(&wl), "LSE: -inf rows differ");
    let fin = |x: &[f64]| {
        x.iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect::<Vec<f64>>()
    };
    let lerr = reference::rel_l2(&fin(&gl), &fin(&wl));
    assert!(lerr < 1e-3, "LSE GPU vs CPU: {lerr:.2e}");
}

/// The window, softcap and sink features with cu_seqlens: `--window`, `--softcap` and `sinks` in the input file,
/// per sequence, on `--cpu` against the reference; with a GPU the kernel against the same; sinks
/// of the wrong count are an error.
#[test]
fn window_softcap_and_sinks_per_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(13);
    let sinks = [0.5f32, -1.0, 2.0, -3.0];
    let sink_bytes: Vec<u8> = sinks.iter().flat_map(|x| x.to_le_bytes()).collect();
    let input = write(
        dir.path(),
        &c,
        vec![("sinks", Dtype::F32, vec![HQ], sink_bytes)],
        &[],
    );
    let output = dir.path().join("out.safetensors");
    let p = AttentionParams {
        batch: LQ.len(),
        seqlen_q: 129,
        seqlen_k: 300,
        heads_q: HQ,
        heads_kv: HKV,
        head_dim: D,
        dtype: DType::Bf16,
        layout: Layout::Bshd,
        causal: true,
        scale: None,
        window: flashcore::attention::Window::from_flash_attn(20, -1),
        softcap: 3.0,
    };
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
    let want = reference::varlen_sinks_f64(
        &p,
        &prefix(&LQ),
        &prefix(&LK),
        &f(&c.q),
        &f(&c.k),
        &f(&c.v),
        Some(&s64),
    );
    let flags = ["--causal", "--window", "20,-1", "--softcap", "3"];
    let mut cpu = vec!["--cpu"];
    cpu.extend(flags);
    let (code, stdout, stderr) = run(&input, &output, &cpu);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("window=20,-1 softcap=3 sinks"), "{stdout}");
    let t = read_file(&output).unwrap();
    let err = reference::rel_l2(&t["out"].data.to_f64(), &want.out);
    assert!(err < 1e-6, "cpu: {err:.2e}");
    if flashcore::attention::Context::new(0).is_ok() {
        let (code, stdout, stderr) = run(&input, &output, &flags);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        let t = read_file(&output).unwrap();
        let err = reference::rel_l2(&t["out"].data.to_f64(), &want.out);
        assert!(err < 1e-2, "gpu: {err:.2e}");
    }
    let three = write(
        dir.path(),
        &c,
        vec![("sinks", Dtype::F32, vec![3], vec![0; 12])],
        &[],
    );
    let (code, _, stderr) = run(&three, &output, &["--cpu"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("one per query head"), "{stderr}");
}

/// The case's output gradient `do` (q's shape) as a file entry.
fn d_o_entry(seed: u64) -> (&'static str, Dtype, Vec<usize>, Vec<u8>) {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let tq = LQ.iter().sum::<usize>();
    (
        "do",
        Dtype::BF16,
        vec![tq, HQ, D],
        bytes_of(&bf16s(&mut r, tq * HQ * D)),
    )
}

/// `--grad` on a varlen input: `--cpu` writes the per-sequence reference gradients
/// (dq q's shape, dk, dv k's), the GPU matches it within bf16's bound (skipped visibly without a
/// GPU), and a missing `do` is an error naming it.
#[test]
fn grad_matches_the_per_sequence_reference() {
    let dir = tempfile::tempdir().unwrap();
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    for causal in [false, true] {
        let c = case(11 + causal as u64);
        let d = d_o_entry(21 + causal as u64);
        let d_o: Vec<f64> =
            d.3.chunks(2)
                .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64())
                .collect();
        let input = write(dir.path(), &c, vec![d], &[]);
        let p = AttentionParams {
            batch: LQ.len(),
            seqlen_q: 129,
            seqlen_k: 300,
            heads_q: HQ,
            heads_kv: HKV,
            head_dim: D,
            dtype: DType::Bf16,
            layout: Layout::Bshd,
            causal,
            scale: None,
            window: Default::default(),
            softcap: 0.0,
        };
        let want = reference::varlen_backward_f64(
            &p,
            &prefix(&LQ),
            &prefix(&LK),
            [None, None],
            &f(&c.q),
            &f(&c.k),
            &f(&c.v),
            &d_o,
        );
        let mut engines = vec![("cpu", vec!["--cpu", "--grad"], 1e-6)];
        if common::gpu("grad_matches_the_per_sequence_reference").is_some() {
            engines.push(("gpu", vec!["--grad"], 1e-2));
        }
        for (engine, mut extra, tol) in engines {
            if causal {
                extra.push("--causal");
            }
            let output = dir.path().join(format!("{engine}{causal}.safetensors"));
            let (code, stdout, stderr) = run(&input, &output, &extra);
            assert_eq!(code, 0, "{stdout}\n{stderr}");
            assert!(
                stdout.contains("--grad: varlen B=5") && stdout.contains("dq, dk, dv"),
                "{stdout}"
            );
            let t = read_file(&output).unwrap();
            let (tq, tk) = (LQ.iter().sum::<usize>(), LK.iter().sum::<usize>());
            for (name, w, shape) in [
                ("dq", &want.dq, vec![tq, HQ, D]),
                ("dk", &want.dk, vec![tk, HKV, D]),
                ("dv", &want.dv, vec![tk, HKV, D]),
            ] {
                assert_eq!(t[name].shape, shape, "{engine} {name}");
                let got = t[name].data.to_f64();
                assert!(
                    got.iter().all(|x| x.is_finite()),
                    "{engine} {name}: not finite"
                );
                let err = reference::rel_l2(&got, w);
                assert!(err < tol, "{engine} causal {causal} {name}: {err:.2e}");
            }
        }
    }
    let input = write(dir.path(), &case(3), vec![], &[]);
    let (code, _, stderr) = run(
        &input,
        &dir.path().join("x.safetensors"),
        &["--cpu", "--grad"],
    );
    assert_ne!(code, 0);
    assert!(stderr.contains("`do`"), "{stderr}");
}
