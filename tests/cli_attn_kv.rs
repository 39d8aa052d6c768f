//! `flashcore attn` on a KV-cache input file (`k_cache`, `v_cache`, `cache_seqlens`, optional new
//! `k`, `v`): the append and the attention on `--cpu` against the reference computed here, the
//! error paths, and the GPU path against `--cpu` (skipped visibly without a GPU).

mod common;

use flashcore::attention::AttentionParams;
use flashcore::reference;
use flashcore::tensor_io::read_file;
use half::bf16;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const B: usize = 3;
const CAP: usize = 40;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 64;
const SQ: usize = 2;

fn bf16s(r: &mut impl Rng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(r.random_range(-2.0f32..2.0)))
        .collect()
}

fn bytes_of(x: &[bf16]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect()
}

struct Case {
    q: Vec<bf16>,
    kc: Vec<bf16>,
    vc: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    lens: Vec<i32>,
}

fn case(seed: u64) -> Case {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    Case {
        q: bf16s(&mut r, B * SQ * HQ * D),
        kc: bf16s(&mut r, B * CAP * HKV * D),
        vc: bf16s(&mut r, B * CAP * HKV * D),
        k: bf16s(&mut r, B * SQ * HKV * D),
        v: bf16s(&mut r, B * SQ * HKV * D),
        lens: vec![0, 17, (CAP - SQ) as i32],
    }
}

/// Writes the case; `extra` adds (name, dtype, shape, bytes) entries, `skip` leaves names out.
fn write(
    dir: &Path,
    c: &Case,
    extra: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)>,
    skip: &[&str],
) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let name = format!(
        "kv{}.safetensors",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let lens: Vec<u8> = c.lens.iter().flat_map(|l| l.to_le_bytes()).collect();
    let mut entries: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![
        ("q", Dtype::BF16, vec![B, SQ, HQ, D], bytes_of(&c.q)),
        (
            "k_cache",
            Dtype::BF16,
            vec![B, CAP, HKV, D],
            bytes_of(&c.kc),
        ),
        (
            "v_cache",
            Dtype::BF16,
            vec![B, CAP, HKV, D],
            bytes_of(&c.vc),
        ),
        ("k", Dtype::BF16, vec![B, SQ, HKV, D], bytes_of(&c.k)),
        ("v", Dtype::BF16, vec![B, SQ, HKV, D], bytes_of(&c.v)),
        ("cache_seqlens", Dtype::I32, vec![B], lens),
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

/// The caches after the append, and the reference output, per sequence.
fn expected(c: &Case, causal: bool) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let row = HKV * D;
    let (mut kc, mut vc) = (c.kc.clone(), c.vc.clone());
    for (b, &l) in c.lens.iter().enumerate() {
        let dst = (b * CAP + l as usize) * row;
        kc[dst..dst + SQ * row].copy_from_slice(&c.k[b * SQ * row..(b + 1) * SQ * row]);
        vc[dst..dst + SQ * row].copy_from_slice(&c.v[b * SQ * row..(b + 1) * SQ * row]);
    }
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let (q, kf, vf) = (f(&c.q), f(&kc), f(&vc));
    let mut out = Vec::new();
    for (b, &l) in c.lens.iter().enumerate() {
        let n = l as usize + SQ;
        let mut p = AttentionParams::new(1, HQ, SQ, D)
            .seqlen_k(n)
            .causal(causal);
        p.heads_kv = HKV;
        let base = b * CAP * row;
        let r = reference::attention_f64(
            &p,
            &q[b * SQ * HQ * D..(b + 1) * SQ * HQ * D],
            &kf[base..base + n * row],
            &vf[base..base + n * row],
        );
        out.extend(r.out);
    }
    (out, kf, vf)
}

#[test]
fn cpu_appends_and_matches_the_reference() {
    let dir = tempfile::tempdir().unwrap();
    for causal in [false, true] {
        let c = case(7 + causal as u64);
        let input = write(dir.path(), &c, vec![], &[]);
        let output = dir.path().join("out.safetensors");
        let mut args = vec![
            "attn",
            "--cpu",
            "--lse",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ];
        if causal {
            args.push("--causal");
        }
        let (code, stdout, stderr) = common::flashcore(&args);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        assert!(
            stdout.contains("KV cache") && stdout.contains("appended 2 row(s)"),
            "{stdout}"
        );
        let t = read_file(&output).unwrap();
        let (want, kc, vc) = expected(&c, causal);
        let err = reference::rel_l2(&t["out"].data.to_f64(), &want);
        assert!(
            err < 1e-6,
            "causal {causal}: out differs from the reference ({err:.2e})"
        );
        assert_eq!(t["k_cache"].data.to_f64(), kc, "k_cache after the append");
        assert_eq!(t["v_cache"].data.to_f64(), vc, "v_cache after the append");
        assert_eq!(t["lse"].shape, vec![B, HQ, SQ]);
    }
}

#[test]
fn bad_kv_inputs_are_errors_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(1);
    let output = dir.path().join("out.safetensors");
    let run = |input: &Path, extra: &[&str]| {
        let mut args = vec![
            "attn",
            "--cpu",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        common::flashcore(&args)
    };
    let cases: Vec<(PathBuf, &[&str], &str)> = vec![
        (
            write(
                dir.path(),
                &c,
                // A block table over pools of pages of no row.
                vec![
                    ("k_cache", Dtype::BF16, vec![B, 0, HKV, D], vec![]),
                    ("v_cache", Dtype::BF16, vec![B, 0, HKV, D], vec![]),
                    ("block_table", Dtype::I32, vec![B, 1], vec![0; 4 * B]),
                ],
                &[],
            ),
            &[],
            "page_size",
        ),
        (
            write(dir.path(), &c, vec![], &["v"]),
            &[],
            "both `k` and `v`",
        ),
        (
            write(dir.path(), &c, vec![], &["cache_seqlens"]),
            &[],
            "cache_seqlens",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![("cache_seqlens", Dtype::F32, vec![B], vec![0; 4 * B])],
                &[],
            ),
            &[],
            "expected I32",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![(
                    "cache_seqlens",
                    Dtype::I32,
                    vec![B],
                    [0i32, 1, (CAP - 1) as i32]
                        .iter()
                        .flat_map(|l| l.to_le_bytes())
                        .collect(),
                )],
                &[],
            ),
            &[],
            "must lie in [0, 38]",
        ),
        (
            write(
                dir.path(),
                &c,
                vec![("cache_seqlens", Dtype::I32, vec![2], vec![0; 8])],
                &[],
            ),
            &[],
            "expected [3]",
        ),
        (
            write(dir.path(), &c, vec![], &[]),
            &["--layout", "bhsd"],
            "bshd",
        ),
    ];
    for (input, extra, message) in cases {
        let (code, stdout, stderr) = run(&input, extra);
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
    let c = case(3);
    let input = write(dir.path(), &c, vec![], &[]);
    let (gpu_out, cpu_out) = (
        dir.path().join("gpu.safetensors"),
        dir.path().join("cpu.safetensors"),
    );
    for (out, cpu) in [(&gpu_out, false), (&cpu_out, true)] {
        let mut args = vec![
            "attn",
            "--causal",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        if cpu {
            args.push("--cpu");
        }
        let (code, stdout, stderr) = common::flashcore(&args);
        assert_eq!(code, 0, "{stdout}\n{stderr}");
    }
    let (g, w) = (read_file(&gpu_out).unwrap(), read_file(&cpu_out).unwrap());
    let err = reference::rel_l2(&g["out"].data.to_f64(), &w["out"].data.to_f64());
    assert!(err < 1e-2, "GPU vs CPU: {err:.2e}");
    assert_eq!(g["k_cache"].data.to_f64(), w["k_cache"].data.to_f64());
}

/// The same case as pools of pages in shuffled order behind a block table (spare pages of noise),
/// for page sizes of 1, 7, 16 and 40 rows (capacities 40, 42, 48, 40): on the CPU the output
/// equals the contiguous input's bit for bit, and the appended rows land in the right pages; on
/// a GPU (when present) it matches the CPU.
#[test]
fn paged_input_matches_contiguous() {
    for page in [1usize, 7, 16, 40] {
        paged_input_matches_contiguous_with(page);
    }
}

fn paged_input_matches_contiguous_with(page: usize) {
    let slots = CAP.div_ceil(page);
    let dir = tempfile::tempdir().unwrap();
    let c = case(11);
    let row = HKV * D;
    let mut r = rand::rngs::StdRng::seed_from_u64(12 + page as u64);
    let pages = B * slots + 2;
    let mut order: Vec<i32> = (0..pages as i32).collect();
    order.shuffle(&mut r);
    let table: Vec<i32> = order[..B * slots].to_vec();
    let (mut pk, mut pv) = (
        bf16s(&mut r, pages * page * row),
        bf16s(&mut r, pages * page * row),
    );
    for b in 0..B {
        for t in 0..CAP {
            let pg = table[b * slots + t / page] as usize;
            let dst = (pg * page + t % page) * row;
            let src = (b * CAP + t) * row;
            pk[dst..dst + row].copy_from_slice(&c.kc[src..src + row]);
            pv[dst..dst + row].copy_from_slice(&c.vc[src..src + row]);
        }
    }
    let tbytes: Vec<u8> = table.iter().flat_map(|x| x.to_le_bytes()).collect();
    let paged = write(
        dir.path(),
        &c,
        vec![
            (
                "k_cache",
                Dtype::BF16,
                vec![pages, page, HKV, D],
                bytes_of(&pk),
            ),
            (
                "v_cache",
                Dtype::BF16,
                vec![pages, page, HKV, D],
                bytes_of(&pv),
            ),
            ("block_table", Dtype::I32, vec![B, slots], tbytes),
        ],
        &[],
    );
    let contiguous = write(dir.path(), &c, vec![], &[]);
    let run_to = |input: &Path, name: &str, cpu: bool| {
        let out = dir.path().join(name);
        let mut args = vec![
            "attn",
            "--causal",
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ];
        if cpu {
            args.push("--cpu");
        }
        let (code, stdout, stderr) = common::flashcore(&args);
        assert_eq!(code, 0, "page {page}: {stdout}\n{stderr}");
        read_file(&out).unwrap()
    };
    let p_cpu = run_to(&paged, "paged_cpu.safetensors", true);
    let c_cpu = run_to(&contiguous, "cont_cpu.safetensors", true);
    assert_eq!(
        p_cpu["out"].data.to_f64(),
        c_cpu["out"].data.to_f64(),
        "page {page}: paged vs contiguous output"
    );
    assert_eq!(p_cpu["k_cache"].shape, vec![pages, page, HKV, D]);
    // The appended rows, read back through the table.
    let (got, want) = (
        p_cpu["k_cache"].data.to_f64(),
        c_cpu["k_cache"].data.to_f64(),
    );
    for b in 0..B {
        for t in 0..CAP {
            let pg = table[b * slots + t / page] as usize;
            let g = (pg * page + t % page) * row;
            let w = (b * CAP + t) * row;
            assert_eq!(
                &got[g..g + row],
                &want[w..w + row],
                "page {page}: sequence {b} row {t}"
            );
        }
    }
    if common::gpu("paged_input_matches_contiguous (GPU part)").is_some() {
        let p_gpu = run_to(&paged, "paged_gpu.safetensors", false);
        let err = reference::rel_l2(&p_gpu["out"].data.to_f64(), &p_cpu["out"].data.to_f64());
        assert!(err < 1e-2, "page {page}: paged GPU vs CPU: {err:.2e}");
        assert_eq!(
            p_gpu["k_cache"].data.to_f64(),
            got,
            "page {page}: paged GPU append"
        );
    }
}

/// The window, softcap and sink features over a KV cache: `--window`, `--softcap` and `sinks` in the input file,
/// on `--cpu` against the reference computed here (positions aligned to each count), with a GPU
/// the kernel against the same; sinks of the wrong count are an error.
#[test]
fn window_softcap_and_sinks_over_a_kv_cache() {
    let dir = tempfile::tempdir().unwrap();
    let c = case(11);
    let sinks = [0.5f32, -1.0, 2.0, -3.0];
    let sink_bytes: Vec<u8> = sinks.iter().flat_map(|x| x.to_le_bytes()).collect();
    let input = write(
        dir.path(),
        &c,
        vec![("sinks", Dtype::F32, vec![HQ], sink_bytes)],
        &[],
    );
    let output = dir.path().join("out.safetensors");
    // The reference: the caches after the append, each sequence on its own with the features.
    let (_, kf, vf) = expected(&c, true);
    let f = |x: &[bf16]| x.iter().map(|v| v.to_f64()).collect::<Vec<f64>>();
    let q = f(&c.q);
    let s64: Vec<f64> = sinks.iter().map(|&x| x as f64).collect();
    let row = HKV * D;
    let mut want = Vec::new();
    for (b, &l) in c.lens.iter().enumerate() {
        let n = l as usize + SQ;
        let mut p = AttentionParams::new(1, HQ, SQ, D)
            .seqlen_k(n)
            .causal(true)
            .window(flashcore::attention::Window::from_flash_attn(5, -1))
            .softcap(3.0);
        p.heads_kv = HKV;
        let base = b * CAP * row;
        let r = reference::attention_f64_sinks(
            &p,
            &q[b * SQ * HQ * D..(b + 1) * SQ * HQ * D],
            &kf[base..base + n * row],
            &vf[base..base + n * row],
            Some(&s64),
        );
        want.extend(r.out);
    }
    let args = |cpu: bool| {
        let mut a = vec![
            "attn",
            "--causal",
            "--window",
            "5,-1",
            "--softcap",
            "3",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ];
        if cpu {
            a.push("--cpu");
        }
        a
    };
    let (code, stdout, stderr) = common::flashcore(&args(true));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("window=5,-1 softcap=3 sinks"), "{stdout}");
    let err = reference::rel_l2(&read_file(&output).unwrap()["out"].data.to_f64(), &want);
    assert!(err < 1e-6, "cpu: {err:.2e}");
    if flashcore::attention::Context::new(0).is_ok() {
        let (code, stdout, stderr) = common::flashcore(&args(false));
        assert_eq!(code, 0, "{stdout}\n{stderr}");
        let err = reference::rel_l2(&read_file(&output).unwrap()["out"].data.to_f64(), &want);
        assert!(err < 1e-2, "gpu: {err:.2e}");
    }
    let three = write(
        dir.path(),
        &c,
        vec![("sinks", Dtype::F32, vec![3], vec![0; 12])],
        &[],
    );
    let (code, _, stderr) = common::flashcore(&[
        "attn",
        "--cpu",
        "--input",
        three.to_str().unwrap(),
        "--output",
        output.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("one per query head"), "{stderr}");
}
