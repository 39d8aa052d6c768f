//! Causal prefill with more tile pairs than SMs takes its tiles in the dynamic order (a counter
//! hands them out heaviest first) unless FLASHCORE_TILE_ORDER=static: the same bits either way,
//! run after run (the counter is left zero for the next launch, or tiles would be skipped), and
//! within tolerance of the float64 reference. This file holds one test so that nothing else in
//! the process reads the environment while it changes.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};

fn case<T: Element>(ctx: &flashcore::attention::Context, p: &AttentionParams) {
    let mut rng = rng_from(seed());
    let q: Vec<T> = randn(&mut rng, p.q_len());
    let k: Vec<T> = randn(&mut rng, p.kv_len());
    let v: Vec<T> = randn(&mut rng, p.kv_len());
    let mut first: Option<(&str, Vec<u64>, Vec<u32>)> = None;
    for order in ["dynamic", "static", "dynamic", "dynamic"] {
        // SAFETY (edition 2021: set_var is safe): the only test of this binary; no other thread
        // reads the environment while it changes.
        if order == "static" {
            std::env::set_var("FLASHCORE_TILE_ORDER", "static");
        } else {
            std::env::remove_var("FLASHCORE_TILE_ORDER");
        }
        let got = run_inputs(ctx, p, &q, &k, &v).unwrap_or_else(|e| panic!("{order}: {e}"));
        assert!(
            got.out_err <= tolerance(p.dtype),
            "{p:?} {order}: rel L2 {} over the tolerance",
            got.out_err
        );
        let lse: Vec<u32> = got.lse.iter().map(|x| x.to_bits()).collect();
        match &first {
            None => first = Some((order, bits(&got.out), lse)),
            Some((o0, out0, lse0)) => {
                assert!(
                    *out0 == bits(&got.out),
                    "{p:?}: output bits differ between the {o0} and the {order} order"
                );
                assert!(
                    *lse0 == lse,
                    "{p:?}: LSE bits differ between {o0} and {order}"
                );
            }
        }
    }
    std::env::remove_var("FLASHCORE_TILE_ORDER");
}

#[test]
fn the_dynamic_order_gives_the_static_orders_bits() {
    let Some(ctx) = gpu("the_dynamic_order_gives_the_static_orders_bits") else {
        return;
    };
    // The causal d64 builds of 128 rows take the dynamic order: 528 pairs of tiles; 256 pairs
    // in bf16; GQA with an odd length (288 pairs).
    case::<half::f16>(&ctx, &AttentionParams::new(4, 33, 1024, 64).causal(true));
    case::<half::bf16>(
        &ctx,
        &AttentionParams::new(2, 16, 2048, 64)
            .causal(true)
            .dtype(DType::Bf16),
    );
    let mut gqa = AttentionParams::new(3, 24, 1000, 64).causal(true);
    gqa.heads_kv = 8;
    case::<half::f16>(&ctx, &gqa);
}
