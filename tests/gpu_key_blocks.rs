//! Non-causal calls at d128 with at least 4096 keys run on 176-key blocks, and d256 calls with at
//! least 1024 keys (causal: 4096) on 80-key blocks (`Variant::for_shape`, PERF_NOTES, "d128
//! non-causal on 176-key blocks" and "d256 on 80-key blocks"): the rule
//! itself (CPU), accuracy against the fp64 reference at odd shapes around it, and bitwise
//! determinism and batch invariance across the light-tile rule's boundary (64-row and 128-row
//! tiles on the same key block). GPU tests skip visibly without a GPU; fail under
//! FLASHCORE_REQUIRE_GPU=1.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};
use flashcore::kernels::{shipped_variants, Variant};

#[test]
fn the_rule_takes_long_key_blocks_for_d128_and_d256() {
    let shipped = shipped_variants();
    for dtype in [DType::F16, DType::Bf16] {
        let v = |d, causal, slen, sq, sk| Variant::for_shape(dtype, d, causal, slen, sq, sk);
        assert_eq!(v(128, false, false, 1, 4096).block_n, 176);
        assert_eq!(v(128, false, false, 16384, 16384).block_n, 176);
        assert_eq!(v(128, false, false, 4096, 4095).block_n, 128);
        assert_eq!(v(128, true, false, 8192, 8192).block_n, 128);
        assert_eq!(v(128, false, true, 8192, 8192).block_n, 128);
        assert_eq!(v(64, false, false, 8192, 8192).block_n, 128);
        assert_eq!(v(256, false, false, 1, 1024).block_n, 80);
        assert_eq!(v(256, false, false, 4096, 1023).block_n, 64);
        assert_eq!(v(256, false, false, 16384, 16384).block_n, 80);
        assert_eq!(v(256, true, false, 8192, 8192).block_n, 80);
        assert_eq!(v(256, true, false, 1, 4096).block_n, 80);
        assert_eq!(v(256, true, false, 4096, 4095).block_n, 64);
        assert_eq!(v(256, true, true, 8192, 8192).block_n, 64);
        assert_eq!(v(256, false, true, 8192, 8192).block_n, 64);
        assert_eq!(v(96, false, false, 8192, 8192).block_n, 128);
        // Whatever the batch, the light-tile rule keeps the key block, and both tiles are shipped.
        for (d, causal, sk, keys) in [
            (128, false, 4500, 176),
            (256, false, 1100, 80),
            (256, true, 4100, 80),
        ] {
            let big = v(d, causal, false, 300, sk);
            let light = big.with_light_tiles(1, 2, 300, 132);
            let heavy = big.with_light_tiles(64, 2, 300, 132);
            assert_eq!((light.block_m, light.block_n), (64, keys));
            assert_eq!((heavy.block_m, heavy.block_n), (128, keys));
            assert!(shipped.contains(&light) && shipped.contains(&heavy));
        }
    }
}

fn check<T: Element>(p: &AttentionParams) {
    let Some(ctx) = gpu("long_key_blocks_match_the_reference") else {
        return;
    };
    let mut rng = rng_from(seed());
    let o = run_case::<T>(&ctx, p, &mut rng).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{p:?}: rel L2 {:.3e}", o.out_err);
}

#[test]
fn long_key_blocks_match_the_reference() {
    // Sk a multiple of the block or not, Sq = 1, 17, 1000 (non-causal), GQA 4/2; f16 and bf16.
    let gqa = |d, sk| AttentionParams {
        heads_kv: 2,
        ..AttentionParams::new(2, 4, 1, d).seqlen_k(sk)
    };
    let shapes = [
        AttentionParams::new(1, 2, 1000, 128).seqlen_k(4500),
        AttentionParams::new(1, 2, 17, 128).seqlen_k(8191),
        gqa(128, 4096),
        AttentionParams::new(1, 1, 4224, 128), // 24 blocks of 176 exactly
        AttentionParams::new(1, 2, 1000, 256).seqlen_k(1101),
        AttentionParams::new(1, 2, 17, 256).seqlen_k(1024),
        gqa(256, 4096),
        AttentionParams::new(1, 1, 1040, 256), // 13 blocks of 80 exactly
        AttentionParams::new(1, 2, 1000, 256)
            .seqlen_k(4101)
            .causal(true),
        AttentionParams::new(1, 1, 4160, 256).causal(true), // 52 blocks of 80 exactly
        AttentionParams {
            heads_kv: 2,
            ..AttentionParams::new(2, 4, 17, 256)
                .seqlen_k(4096)
                .causal(true)
        },
    ];
    for p in shapes {
        check::<half::f16>(&p);
        check::<half::bf16>(&p.clone().dtype(DType::Bf16));
    }
}

#[test]
fn long_key_blocks_are_deterministic_and_batch_invariant() {
    let Some(ctx) = gpu("long_key_blocks_are_deterministic_and_batch_invariant") else {
        return;
    };
    let mut rng = rng_from(seed());
    // Alone: 5 light 64-row tiles × 2 heads fit one wave (64-row tiles); in a batch of 40 they do
    // not (128-row tiles). Both on the same long key blocks: the bits must not change.
    for (d, causal, sk) in [(128, false, 4500), (256, false, 1100), (256, true, 4100)] {
        let one = AttentionParams::new(1, 2, 300, d)
            .seqlen_k(sk)
            .causal(causal)
            .dtype(DType::Bf16);
        let q: Vec<half::bf16> = randn(&mut rng, one.q_len());
        let k: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let v: Vec<half::bf16> = randn(&mut rng, one.kv_len());
        let alone = run_inputs(&ctx, &one, &q, &k, &v).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..3 {
            let again = launch_unchecked(&ctx, &one, &q, &k, &v);
            assert!(
                bits(&alone.out) == bits(&again.0),
                "d{d}: output bits changed run to run"
            );
        }
        let batch = 40;
        let at = 23;
        let (p, qs, ks, vs) = batch_around(&mut rng, &one, batch, at, &q, &k, &v);
        let nq = one.q_len();
        let (all, lse) = launch_unchecked(&ctx, &p, &qs, &ks, &vs);
        assert!(
            bits(&alone.out) == bits(&all[at * nq..(at + 1) * nq]),
            "d{d}: output bits differ alone vs at {at} in a batch of {batch}"
        );
        let per = one.lse_len();
        let lb = |x: &[f32]| x.iter().map(|e| e.to_bits()).collect::<Vec<u32>>();
        assert!(
            lb(&alone.lse) == lb(&lse[at * per..(at + 1) * per]),
            "d{d}: LSE bits differ alone vs in a batch"
        );
    }
}
