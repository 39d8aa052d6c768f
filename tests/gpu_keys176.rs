//! d128 non-causal calls with at least 4096 keys run on 176-key blocks (`Variant::for_shape`,
//! PERF_NOTES branch fwdperf): the rule itself (CPU), accuracy against the fp64 reference at odd
//! shapes around it, and bitwise determinism and batch invariance across the light-tile rule's
//! boundary (64-row and 128-row tiles on 176 keys). GPU tests skip visibly without a GPU; fail
//! under FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};
use flashcore::kernels::{shipped_variants, Variant};

#[test]
fn the_rule_takes_176_keys_for_d128_non_causal_from_4096_keys() {
    let shipped = shipped_variants();
    for dtype in [DType::F16, DType::Bf16] {
        let v = |d, causal, slen, sq, sk| Variant::for_shape(dtype, d, causal, slen, sq, sk);
        assert_eq!(v(128, false, false, 1, 4096).block_n, 176);
        assert_eq!(v(128, false, false, 16384, 16384).block_n, 176);
        assert_eq!(v(128, false, false, 4096, 4095).block_n, 128);
        assert_eq!(v(128, true, false, 8192, 8192).block_n, 128);
        assert_eq!(v(128, false, true, 8192, 8192).block_n, 128);
        assert_eq!(v(64, false, false, 8192, 8192).block_n, 128);
        // Whatever the batch, the light-tile rule keeps the key block, and both tiles are shipped.
        let big = v(128, false, false, 300, 4500);
        let light = big.with_light_tiles(1, 2, 300, 132);
        let heavy = big.with_light_tiles(64, 2, 300, 132);
        assert_eq!((light.block_m, light.block_n), (64, 176));
        assert_eq!((heavy.block_m, heavy.block_n), (128, 176));
        assert!(shipped.contains(&light) && shipped.contains(&heavy));
    }
}

fn check<T: Element>(p: &AttentionParams) {
    let Some(ctx) = gpu("d128_non_causal_176_key_blocks_match_the_reference") else {
        return;
    };
    let mut rng = rng_from(seed());
    let o = run_case::<T>(&ctx, p, &mut rng).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{p:?}: rel L2 {:.3e}", o.out_err);
}

#[test]
fn d128_non_causal_176_key_blocks_match_the_reference() {
    // Sk a multiple of 176 or not, Sq = 1, 17, 1000, Sq > Sk never visible here (non-causal),
    // GQA 4/2; f16 and bf16.
    let shapes = [
        AttentionParams::new(1, 2, 1000, 128).seqlen_k(4500),
        AttentionParams::new(1, 2, 17, 128).seqlen_k(8191),
        AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 4, 1, 128).seqlen_k(4096)
        },
        AttentionParams::new(1, 1, 4224, 128), // 24 blocks of 176 exactly
    ];
    for p in shapes {
        check::<half::f16>(&p);
        check::<half::bf16>(&p.clone().dtype(DType::Bf16));
    }
}

#[test]
fn d128_non_causal_176_key_blocks_are_deterministic_and_batch_invariant() {
    let Some(ctx) = gpu("d128_non_causal_176_key_blocks_are_deterministic_and_batch_invariant")
    else {
        return;
    };
    let mut rng = rng_from(seed());
    // Alone: 5 light 64-row tiles × 2 heads fit one wave (64-row tiles); in a batch of 40 they do
    // not (128-row tiles). Both on 176 keys: the bits must not change.
    let one = AttentionParams::new(1, 2, 300, 128)
        .seqlen_k(4500)
        .dtype(DType::Bf16);
    let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
    let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
    let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
    let alone = run_inputs(&ctx, &one, &q, &k, &v).unwrap_or_else(|e| panic!("{e}"));
    let bits = |x: &[half::bf16]| x.iter().map(|e| e.to_bits()).collect::<Vec<u16>>();
    for _ in 0..3 {
        let again = launch_unchecked(&ctx, &one, &q, &k, &v);
        assert!(
            bits(&alone.out) == bits(&again.0),
            "output bits changed run to run"
        );
    }
    let batch = 40;
    let at = 23;
    let (p, qs, ks, vs) = batch_around(&mut rng, &one, batch, at, &q, &k, &v);
    let nq = one.q_len();
    let (all, lse) = launch_unchecked(&ctx, &p, &qs, &ks, &vs);
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
