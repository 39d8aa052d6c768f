//! Decode mode on the GPU (few query positions, long key ranges: GQA packing + split-KV +
//! combine): every element against the float64 reference at odd shapes, bitwise batch
//! invariance, bitwise run-to-run determinism. Skips visibly without a GPU; fails under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::decode::{self, DecodeSchedule};
use flashcore::attention::{AttentionParams, Context, DType, Element, Layout};
use flashcore::kernels::Variant;

/// (batch, heads_q, heads_kv, seqlen_q, seqlen_k): GQA 4:1 and 8:1, MQA, MHA, a group that no
/// power of two > 1 divides (pack 1), Sk not a multiple of the block or split size, Sq > Sk.
const SHAPES: [(usize, usize, usize, usize, usize); 11] = [
    (1, 32, 8, 1, 8191),
    (2, 8, 1, 1, 3000),
    (3, 8, 1, 4, 1000),
    (2, 4, 4, 1, 17),
    (1, 6, 2, 3, 777),
    (2, 16, 2, 16, 129),
    (1, 8, 2, 4, 4097),
    (1, 4, 1, 16, 5),
    (2, 2, 1, 1, 1),
    (1, 64, 1, 2, 300),
    (1, 8, 8, 5, 20000),
];

fn params(
    dtype: DType,
    d: usize,
    causal: bool,
    layout: Layout,
    s: (usize, usize, usize, usize, usize),
) -> AttentionParams {
    let (b, hq, hkv, sq, sk) = s;
    let mut p = AttentionParams::new(b, hq, sq, d)
        .seqlen_k(sk)
        .dtype(dtype)
        .layout(layout)
        .causal(causal);
    p.heads_kv = hkv;
    p
}

fn sweep<T: Element>(ctx: &Context, dtype: DType, seed: u64) -> Vec<String> {
    let mut rng = rng_from(seed);
    let mut failures = Vec::new();
    for d in [64, 128] {
        for causal in [false, true] {
            for (i, &shape) in SHAPES.iter().enumerate() {
                // Both layouts, alternating over the shapes (each layout sees every feature).
                let layout = if (i + causal as usize) % 2 == 0 {
                    Layout::Bshd
                } else {
                    Layout::Bhsd
                };
                let p = params(dtype, d, causal, layout, shape);
                assert!(
                    decode::applies(&p, false),
                    "{p:?} should run in decode mode"
                );
                let splits =
                    DecodeSchedule::new(&p, &Variant::decode(dtype, d, causal).tile(), 132)
                        .unwrap()
                        .num_splits;
                match run_case::<T>(ctx, &p, &mut rng) {
                    Ok(o) => eprintln!(
                        "ok {} d{d} {} {:?} splits {splits:3}  err {:.2e}  lse {:.2e}",
                        dtype.name(),
                        if causal { "causal" } else { "full  " },
                        shape,
                        o.out_err,
                        o.lse_err
                    ),
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    failures
}

fn sweep_test<T: Element>(name: &str, dtype: DType) {
    let Some(ctx) = gpu(name) else {
        return;
    };
    let s = seed();
    let failures = sweep::<T>(&ctx, dtype, s);
    assert!(
        failures.is_empty(),
        "seed {s}: {} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn decode_f16_matches_reference() {
    sweep_test::<half::f16>("decode_f16_matches_reference", DType::F16);
}

#[test]
fn decode_bf16_matches_reference() {
    sweep_test::<half::bf16>("decode_bf16_matches_reference", DType::Bf16);
}

fn bits<T: Element>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

/// One sequence's output rows out of a batched [B, Sq, Hq, D] output.
fn rows_of<T: Copy>(out: &[T], p: &AttentionParams, b: usize) -> Vec<T> {
    let n = p.seqlen_q * p.heads_q * p.head_dim;
    out[b * n..(b + 1) * n].to_vec()
}

#[test]
fn decode_is_batch_invariant_and_deterministic() {
    let Some(ctx) = gpu("decode_is_batch_invariant_and_deterministic") else {
        return;
    };
    let s = seed();
    let mut rng = rng_from(s);
    for (sq, causal) in [(1, false), (4, true)] {
        let one = params(DType::Bf16, 128, causal, Layout::Bshd, (1, 32, 8, sq, 4099));
        let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let (alone, alone_lse) = launch_unchecked(&ctx, &one, &q, &k, &v);
        let (again, again_lse) = launch_unchecked(&ctx, &one, &q, &k, &v);
        assert_eq!(
            bits(&alone),
            bits(&again),
            "seed {s}: output bits differ run to run"
        );
        assert_eq!(
            alone_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            again_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "seed {s}: LSE bits differ run to run"
        );
        // The same sequence at another position of batches of 7 and 64, among random neighbours.
        for (batch, at) in [(7, 3), (64, 63)] {
            let p = AttentionParams {
                batch,
                ..one.clone()
            };
            let mut qb: Vec<half::bf16> = randn(&mut rng, p.q_len());
            let mut kb: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            let mut vb: Vec<half::bf16> = randn(&mut rng, p.kv_len());
            qb[at * q.len()..(at + 1) * q.len()].copy_from_slice(&q);
            kb[at * k.len()..(at + 1) * k.len()].copy_from_slice(&k);
            vb[at * v.len()..(at + 1) * v.len()].copy_from_slice(&v);
            let (out, lse) = launch_unchecked(&ctx, &p, &qb, &kb, &vb);
            assert_eq!(
                bits(&rows_of(&out, &p, at)),
                bits(&alone),
                "seed {s}: sequence's output bits changed in a batch of {batch}"
            );
            let per = one.heads_q * one.seqlen_q;
            assert_eq!(
                lse[at * per..(at + 1) * per]
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>(),
                alone_lse.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "seed {s}: LSE bits changed in a batch of {batch}"
            );
        }
    }
}
