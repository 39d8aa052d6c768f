//! d64 non-causal tiles on 192-key blocks (branch d64t, PERF_NOTES): 128 × 192 and light 64 × 192
//! with P in registers, 192 × 192 with P through shared memory (FC_P_SMEM). The 192-key block is
//! forced with the FLASHCORE_BLOCK_N knob, so these checks hold whatever the shape rule picks;
//! this file holds one test so that nothing else in the process reads the environment while it
//! is set. Accuracy of every output element against the fp64 reference (relative L2, no NaN) at
//! odd shapes (Sk not a multiple of 192, Sq = 1, 17, Sq ≠ Sk, GQA), and bitwise determinism and
//! batch invariance across the light-tile rule's boundary (64-row tiles alone, 192-row tiles in
//! a batch: P in registers vs P in shared memory must give the same bits). GPU tests skip
//! visibly without a GPU; fail under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};

fn check<T: Element>(ctx: &flashcore::attention::Context, p: &AttentionParams) {
    let mut rng = rng_from(seed());
    let o = run_case::<T>(ctx, p, &mut rng).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{p:?}: rel L2 {:.3e}", o.out_err);
}

fn batch_invariance(ctx: &flashcore::attention::Context) {
    let mut rng = rng_from(seed());
    // Alone: ceil(1100 / 64) × 2 heads = 36 light 64-row units fit one wave (P in registers); in
    // a batch of 40 they do not (Sq ≥ 1024: 192-row tiles, P in shared memory).
    let one = AttentionParams::new(1, 2, 1100, 64)
        .seqlen_k(1250)
        .dtype(DType::Bf16);
    let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
    let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
    let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
    let alone = run_inputs(ctx, &one, &q, &k, &v).unwrap_or_else(|e| panic!("{e}"));
    let bits = |x: &[half::bf16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    for _ in 0..3 {
        let again = launch_unchecked(ctx, &one, &q, &k, &v);
        assert!(
            bits(&alone.out) == bits(&again.0),
            "output bits changed run to run"
        );
    }
    let batch = 40;
    let at = 23;
    let p = AttentionParams {
        batch,
        ..one.clone()
    };
    let mut qs: Vec<half::bf16> = randn(&mut rng, p.q_len());
    let mut ks: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let mut vs: Vec<half::bf16> = randn(&mut rng, p.kv_len());
    let (nq, nk) = (one.q_len(), one.kv_len());
    qs[at * nq..(at + 1) * nq].copy_from_slice(&q);
    ks[at * nk..(at + 1) * nk].copy_from_slice(&k);
    vs[at * nk..(at + 1) * nk].copy_from_slice(&v);
    let (all, lse) = launch_unchecked(ctx, &p, &qs, &ks, &vs);
    assert!(
        bits(&alone.out) == bits(&all[at * nq..(at + 1) * nq]),
        "output bits differ alone vs at {at} in a batch of {batch}"
    );
    let per = one.lse_len();
    let lb = |x: &[f32]| x.iter().map(|e| e.to_bits()).collect::<Vec<u32>>();
    assert!(
        lb(&alone.lse) == lb(&lse[at * per..(at + 1) * per]),
        "LSE bits differ alone vs in a batch"
    );
}

#[test]
fn d64_non_causal_192_key_blocks_match_the_reference_and_are_batch_invariant() {
    let Some(ctx) =
        gpu("d64_non_causal_192_key_blocks_match_the_reference_and_are_batch_invariant")
    else {
        return;
    };
    // SAFETY (edition 2021: set_var is safe): the only test of this binary.
    std::env::set_var("FLASHCORE_BLOCK_N", "192");
    let shapes = [
        // Few tiles: light 64-row tiles; Sk = 4500 leaves an 84-key last block.
        AttentionParams::new(1, 2, 1000, 64).seqlen_k(4500),
        AttentionParams::new(1, 2, 1100, 64).seqlen_k(4500),
        // More than one wave and Sq ≥ 1024: 192-row tiles (P in shared memory).
        AttentionParams::new(2, 3, 2049, 64).seqlen_k(1000),
        AttentionParams::new(2, 2, 4608, 64), // 24 blocks of 192 exactly
        AttentionParams::new(1, 2, 17, 64).seqlen_k(8191),
        AttentionParams::new(1, 2, 17, 64),
        AttentionParams::new(1, 2, 1, 64).seqlen_k(1),
        AttentionParams::new(3, 2, 1000, 64).seqlen_k(191),
        AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 4, 1, 64).seqlen_k(4096)
        },
        AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 8, 1500, 64).seqlen_k(777)
        },
        // Enough tiles for 128-row (below 1024 queries) and 192-row tiles, not light ones.
        AttentionParams::new(8, 16, 1000, 64).seqlen_k(600),
        AttentionParams::new(4, 16, 1024, 64).seqlen_k(1537),
    ];
    for p in shapes {
        check::<half::f16>(&ctx, &p);
        check::<half::bf16>(&ctx, &p.clone().dtype(DType::Bf16));
    }
    batch_invariance(&ctx);
    std::env::remove_var("FLASHCORE_BLOCK_N");
}
