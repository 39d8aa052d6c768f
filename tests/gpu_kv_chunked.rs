//! Chunked prefill over a KV cache on the GPU (`Context::attention_kv_chunked`):
//! packed chunks of new queries over a contiguous cache against the float64 reference per
//! sequence, the bits of the same rows run as a compact varlen pack, and the cache kinds the
//! path refuses. Skips visibly without a GPU; fails under FLASHCORE_REQUIRE_GPU=1.

mod common;

use common::{gpu, poison, randn, rng_from, seed, tolerance};
use flashcore::attention::{AttentionParams, Context, DType, Element, KvCache, Layout, Pages};
use flashcore::reference;

fn prefix(lens: &[usize]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    cu
}

fn f64s<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

fn bits<T: Element>(x: &[T]) -> Vec<u64> {
    x.iter().map(|v| v.to_f64().to_bits()).collect()
}

fn chunk_case<T: Element>(
    ctx: &Context,
    dtype: DType,
    d: usize,
    hq: usize,
    hkv: usize,
    causal: bool,
) {
    let s = seed();
    let mut rng = rng_from(s);
    let cap = 1024;
    let counts = [117usize, 1000, 17, 1024]; // keys per sequence after the append
    let chunks = [100usize, 1000, 17, 1]; // its newest positions are the queries
    let row_k = hkv * d;
    let row_q = hq * d;
    let p = AttentionParams {
        batch: counts.len(),
        seqlen_q: *chunks.iter().max().unwrap(),
        seqlen_k: cap,
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        dtype,
        causal,
        ..AttentionParams::new(1, 1, 1, d)
    }
    .layout(Layout::Bshd);
    let kc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    let vc: Vec<T> = randn(&mut rng, counts.len() * cap * row_k);
    let cu_q = prefix(&chunks);
    let total_q = *cu_q.last().unwrap() as usize;
    let q: Vec<T> = randn(&mut rng, total_q * row_q);
    let (dq, dk, dv) = (
        ctx.upload(&q).unwrap(),
        ctx.upload(&kc).unwrap(),
        ctx.upload(&vc).unwrap(),
    );
    let lens: Vec<i32> = counts.iter().map(|&c| c as i32).collect();
    let dlens = ctx.upload(&lens).unwrap();
    let dcu_q = ctx.upload(&cu_q).unwrap();
    let mut dout = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    let mut dlse = ctx.upload(&vec![f32::NAN; hq * total_q]).unwrap();
    let cache = KvCache::contiguous(&dk, &dv, &dlens);
    ctx.attention_kv_chunked(&p, &dq, &cache, &dcu_q, &mut dout, Some(&mut dlse))
        .unwrap_or_else(|e| panic!("seed {s} {p:?}: {e}"));
    let out = ctx.download(&dout).unwrap();
    // The same sequences as a compact pack: sequence b's keys are its cache's first counts[b] rows.
    let cu_k = prefix(&counts);
    let (mut kp, mut vp) = (Vec::new(), Vec::new());
    for (b, &c) in counts.iter().enumerate() {
        kp.extend_from_slice(&kc[b * cap * row_k..(b * cap + c) * row_k]);
        vp.extend_from_slice(&vc[b * cap * row_k..(b * cap + c) * row_k]);
    }
    let pp = AttentionParams {
        seqlen_k: *counts.iter().max().unwrap(),
        ..p.clone()
    };
    let want = reference::varlen_f64(&pp, &cu_q, &cu_k, &f64s(&q), &f64s(&kp), &f64s(&vp));
    let got = f64s(&out);
    assert!(
        got.iter().all(|x| x.is_finite()),
        "seed {s}: non-finite output"
    );
    for b in 0..counts.len() {
        let (a, e) = (cu_q[b] as usize * row_q, cu_q[b + 1] as usize * row_q);
        let err = reference::rel_l2(&got[a..e], &want.out[a..e]);
        assert!(
            err <= tolerance(dtype),
            "seed {s} {p:?}: sequence {b} rel L2 {err:.3e}"
        );
    }
    let lse = ctx.download(&dlse).unwrap();
    assert!(
        lse.iter().all(|x| x.is_finite()),
        "seed {s}: non-finite LSE"
    );
    // The compact pack through the plain varlen call: the same bits.
    let (dkp, dvp, dcu_k) = (
        ctx.upload(&kp).unwrap(),
        ctx.upload(&vp).unwrap(),
        ctx.upload(&cu_k).unwrap(),
    );
    let mut dout2 = ctx.upload(&vec![poison::<T>(); q.len()]).unwrap();
    ctx.attention_varlen(&pp, &dq, &dkp, &dvp, &dcu_q, &dcu_k, &mut dout2, None)
        .unwrap();
    assert_eq!(
        bits(&out),
        bits(&ctx.download(&dout2).unwrap()),
        "seed {s} {p:?}: chunked rows differ in bits from the compact varlen pack"
    );
    eprintln!("ok seed {s} {p:?}");
}

#[test]
fn kv_chunked_prefill_matches_reference_and_varlen_bits() {
    let Some(ctx) = gpu("kv_chunked_prefill_matches_reference_and_varlen_bits") else {
        return;
    };
    chunk_case::<half::bf16>(&ctx, DType::Bf16, 128, 16, 4, true);
    chunk_case::<half::f16>(&ctx, DType::F16, 64, 8, 8, false);
    chunk_case::<half::f16>(&ctx, DType::F16, 128, 8, 1, true);
}

#[test]
fn kv_chunked_prefill_refuses_what_it_does_not_take() {
    let Some(ctx) = gpu("kv_chunked_prefill_refuses_what_it_does_not_take") else {
        return;
    };
    let p = AttentionParams::new(2, 4, 32, 64)
        .seqlen_k(64)
        .layout(Layout::Bshd);
    let kv = ctx.alloc::<half::f16>(p.kv_len()).unwrap();
    let q = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let mut out = ctx.alloc::<half::f16>(64 * 4 * 64).unwrap();
    let lens = ctx.upload(&[3i32, 5]).unwrap();
    let cu = ctx.upload(&[0i32, 32, 64]).unwrap();
    let table = ctx.upload(&[0i32, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    let sinks = ctx.alloc::<f32>(3).unwrap(); // one short of a sink per query head
    let pages = Pages {
        page_size: 16,
        num_pages: 8,
    };
    let base = KvCache::contiguous(&kv, &kv, &lens);
    let cases: [(KvCache<'_, half::f16>, &str); 5] = [
        (
            KvCache::paged(&kv, &kv, &lens, &table, pages),
            "block_table",
        ),
        (base.secret(), "secret_lengths"),
        (base.leftpad(&lens), "leftpad"),
        (base.prefill_consistent(), "prefill_consistent"),
        // Sinks are taken, but one per query head.
        (base.sinks(&sinks), "sinks"),
    ];
    for (cache, want) in cases {
        match ctx.attention_kv_chunked(&p, &q, &cache, &cu, &mut out, None) {
            Err(flashcore::Error::InvalidArgument { arg, .. }) if arg == want => {}
            other => panic!("{want}: expected InvalidArgument, got {other:?}"),
        }
    }
    let short = ctx.upload(&[3i32]).unwrap();
    match ctx.attention_kv_chunked(
        &p,
        &q,
        &KvCache::contiguous(&kv, &kv, &short),
        &cu,
        &mut out,
        None,
    ) {
        Err(flashcore::Error::InvalidArgument {
            arg: "seqlens_k", ..
        }) => {}
        other => panic!("one count for two sequences: expected InvalidArgument, got {other:?}"),
    }
    match ctx.attention_kv_chunked(
        &p.clone().layout(Layout::Bhsd),
        &q,
        &base,
        &cu,
        &mut out,
        None,
    ) {
        Err(flashcore::Error::InvalidArgument { arg: "layout", .. }) => {}
        other => panic!("bhsd: expected InvalidArgument, got {other:?}"),
    }
}
