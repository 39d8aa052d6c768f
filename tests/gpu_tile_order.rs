//! Causal prefill with more tile pairs than SMs takes its tiles in the dynamic order (a counter
//! hands them out heaviest first) unless FLASHCORE_TILE_ORDER=static: the same bits either way,
//! run after run (the counter is left zero for the next launch, or tiles would be skipped), and
//! within tolerance of the float64 reference; at d64, d96 and d128, with public and secret
//! lengths. That each shape takes the dynamic order is checked first, without a GPU. This file
//! holds one test so that nothing else in the process reads the environment while it changes.

mod common;
use common::*;
use flashcore::attention::{AttentionParams, DType, Element};

/// Sets the tile order for the next launches: `static`, or the default (dynamic where it runs).
fn set_order(order: &str) {
    // SAFETY (edition 2021: set_var is safe): the only test of this binary; no other thread
    // reads the environment while it changes.
    if order == "static" {
        std::env::set_var("FLASHCORE_TILE_ORDER", "static");
    } else {
        std::env::remove_var("FLASHCORE_TILE_ORDER");
    }
}

fn case<T: Element>(ctx: &flashcore::attention::Context, p: &AttentionParams) {
    let mut rng = rng_from(seed());
    let q: Vec<T> = randn(&mut rng, p.q_len());
    let k: Vec<T> = randn(&mut rng, p.kv_len());
    let v: Vec<T> = randn(&mut rng, p.kv_len());
    let mut first: Option<(&str, Vec<u64>, Vec<u32>)> = None;
    for order in ["dynamic", "static", "dynamic", "dynamic"] {
        set_order(order);
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

/// Secret-length mode (`lens` true lengths inside the padded shape): the same bits in either
/// order, run after run, rows past a length zero.
fn secret_len_case<T: Element>(
    ctx: &flashcore::attention::Context,
    p: &AttentionParams,
    lens: &[i32],
) {
    let mut rng = rng_from(seed());
    let q = ctx.upload(&randn::<T>(&mut rng, p.q_len())).unwrap();
    let k = ctx.upload(&randn::<T>(&mut rng, p.kv_len())).unwrap();
    let v = ctx.upload(&randn::<T>(&mut rng, p.kv_len())).unwrap();
    let dlens = ctx.upload(lens).unwrap();
    let mut first: Option<(&str, Vec<u64>, Vec<u32>)> = None;
    for order in ["dynamic", "static", "dynamic", "dynamic"] {
        set_order(order);
        let mut out = ctx.upload(&vec![poison::<T>(); p.q_len()]).unwrap();
        let mut lse = ctx.upload(&vec![f32::NAN; p.lse_len()]).unwrap();
        ctx.attention_secret_len(p, &q, &k, &v, &mut out, Some(&mut lse), &dlens)
            .unwrap_or_else(|e| panic!("{p:?} {order}: {e}"));
        let out: Vec<T> = ctx.download(&out).unwrap();
        let lse: Vec<u32> = ctx
            .download(&lse)
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert!(
            out.iter().all(|x| x.to_f64().is_finite()),
            "{p:?} {order}: a non-finite output"
        );
        match &first {
            None => first = Some((order, bits(&out), lse)),
            Some((o0, out0, lse0)) => {
                assert!(
                    *out0 == bits(&out),
                    "{p:?} lens {lens:?}: output bits differ between the {o0} and the {order} order"
                );
                assert!(
                    *lse0 == lse,
                    "{p:?} lens {lens:?}: LSE bits differ between {o0} and {order}"
                );
            }
        }
    }
    std::env::remove_var("FLASHCORE_TILE_ORDER");
}

/// Whether a call with `p` (secret lengths if `secret`) takes the dynamic order on an H100 or
/// H200 (132 SMs): its build has the order compiled in and its schedule hands out a counter's
/// tickets. Needs no GPU.
fn takes_the_dynamic_order(p: &AttentionParams, secret: bool) -> bool {
    use flashcore::attention::launch::Schedule;
    use flashcore::kernels::{select, TestBuild};
    use flashcore::spec::Lengths;
    const SMS: usize = 132;
    let lengths = if secret {
        Lengths::SecretPadded
    } else {
        Lengths::None
    };
    let v = select::forward(p, lengths, TestBuild::default(), SMS)
        .unwrap_or_else(|e| panic!("{p:?}: {e}"))
        .variant;
    let s = Schedule::new(p, &v.tile(), v.causal, SMS).unwrap_or_else(|e| panic!("{p:?}: {e}"));
    v.dynamic_order() && s.dynamic.is_some()
}

#[test]
fn the_dynamic_order_gives_the_static_orders_bits() {
    // The causal d64 builds of 128 rows take the dynamic order: 528 pairs of tiles; 256 pairs
    // in bf16; GQA with an odd length (288 pairs).
    let d64 = AttentionParams::new(4, 33, 1024, 64).causal(true);
    let d64_bf16 = AttentionParams::new(2, 16, 2048, 64)
        .causal(true)
        .dtype(DType::Bf16);
    let mut gqa = AttentionParams::new(3, 24, 1000, 64).causal(true);
    gqa.heads_kv = 8;
    // The causal d128 and d96 builds of 128 rows take it too: 256 pairs in bf16 and in f16 with
    // GQA; d96 with an odd length (144 pairs).
    let d128 = AttentionParams::new(2, 16, 2048, 128).causal(true);
    let d128_bf16 = d128.clone().dtype(DType::Bf16);
    let mut gqa128 = d128.clone();
    gqa128.heads_kv = 4;
    let d96 = AttentionParams::new(2, 12, 1500, 96).causal(true);
    // And the secret-length builds (d128 and d64), a length short of the padded one.
    let slen64 = AttentionParams::new(2, 33, 1024, 64).causal(true);
    for p in [&d64, &d64_bf16, &gqa, &d128_bf16, &gqa128, &d96] {
        assert!(takes_the_dynamic_order(p, false), "{p:?}");
    }
    for p in [&d128_bf16, &slen64] {
        assert!(takes_the_dynamic_order(p, true), "{p:?} (secret lengths)");
    }
    // Not d256 (its consumers spill with it), nor 4 query tiles per head.
    let d256 = AttentionParams::new(2, 16, 2048, 256).causal(true);
    assert!(!takes_the_dynamic_order(&d256, false));
    assert!(!takes_the_dynamic_order(
        &AttentionParams::new(16, 16, 512, 128).causal(true),
        false
    ));

    let Some(ctx) = gpu("the_dynamic_order_gives_the_static_orders_bits") else {
        return;
    };
    case::<half::f16>(&ctx, &d64);
    case::<half::bf16>(&ctx, &d64_bf16);
    case::<half::f16>(&ctx, &gqa);
    case::<half::bf16>(&ctx, &d128_bf16);
    case::<half::f16>(&ctx, &gqa128);
    case::<half::f16>(&ctx, &d96);
    secret_len_case::<half::bf16>(&ctx, &d128_bf16, &[2048, 1337]);
    secret_len_case::<half::f16>(&ctx, &slen64, &[700, 1024]);
}
