//! A row's output bits do not depend on the tile height (64, 128 or 192 query rows per CTA):
//! what lets `Variant::with_light_tiles` choose the tile by the whole launch's size (batch
//! included) without breaking batch invariance. Each tile height is forced with the
//! FLASHCORE_BLOCK_M knob; this file holds one test so that nothing else in the process reads
//! the environment while it changes.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};

fn case<T: Element>(ctx: &flashcore::attention::Context, p: &AttentionParams, heights: &[usize]) {
    let mut rng = rng_from(seed());
    let q: Vec<T> = randn(&mut rng, p.q_len());
    let k: Vec<T> = randn(&mut rng, p.kv_len());
    let v: Vec<T> = randn(&mut rng, p.kv_len());
    let mut first: Option<(usize, Vec<u64>, Vec<u32>)> = None;
    for &m in heights {
        // SAFETY (edition 2021: set_var is safe): the only test of this binary; no other thread
        // reads the environment while it changes.
        std::env::set_var("FLASHCORE_BLOCK_M", m.to_string());
        let got = run_inputs(ctx, p, &q, &k, &v).unwrap_or_else(|e| panic!("block_m {m}: {e}"));
        assert!(
            got.out_err <= tolerance(p.dtype),
            "{p:?} block_m {m}: rel L2 {} over the tolerance",
            got.out_err
        );
        let lse: Vec<u32> = got.lse.iter().map(|x| x.to_bits()).collect();
        match &first {
            None => first = Some((m, bits(&got.out), lse)),
            Some((m0, out0, lse0)) => {
                assert!(
                    *out0 == bits(&got.out),
                    "{p:?}: output bits differ between block_m {m0} and {m}"
                );
                assert!(
                    *lse0 == lse,
                    "{p:?}: LSE bits differ between block_m {m0} and {m}"
                );
            }
        }
    }
    std::env::remove_var("FLASHCORE_BLOCK_M");
}

#[test]
fn output_bits_do_not_depend_on_the_tile_height() {
    let Some(ctx) = gpu("output_bits_do_not_depend_on_the_tile_height") else {
        return;
    };
    for causal in [false, true] {
        let p = AttentionParams::new(1, 8, 512, 64).causal(causal);
        case::<half::f16>(&ctx, &p, &[64, 128, 192]);
        let p = AttentionParams::new(2, 4, 1000, 64)
            .seqlen_k(1300)
            .causal(causal)
            .dtype(DType::Bf16);
        case::<half::bf16>(&ctx, &p, &[64, 128, 192]);
        let p = AttentionParams::new(1, 4, 777, 128)
            .causal(causal)
            .dtype(DType::Bf16);
        case::<half::bf16>(&ctx, &p, &[64, 128]);
        let p = AttentionParams::new(3, 2, 300, 128)
            .seqlen_k(170)
            .causal(causal);
        case::<half::f16>(&ctx, &p, &[64, 128]);
        // Non-causal: 176-key blocks from 4096 keys (Variant::for_shape), in both heights.
        let p = AttentionParams::new(1, 2, 300, 128)
            .seqlen_k(4500)
            .causal(causal);
        case::<half::f16>(&ctx, &p, &[64, 128]);
    }
}
