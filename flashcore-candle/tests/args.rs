//! Argument checking, no GPU needed: every error path of the public calls, triggered with CPU
//! tensors (the checks run before the device is looked at), and which layouts are read in place.

use candle_core::{DType, Device, Layout, Result, Tensor};
use flashcore_candle::*;

fn t(shape: &[usize], dt: DType) -> Tensor {
    Tensor::zeros(shape, dt, &Device::Cpu).unwrap()
}
fn h(shape: &[usize]) -> Tensor {
    t(shape, DType::F16)
}

/// The error's message; panics if the call succeeded.
fn msg(r: Result<Tensor>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn expect(r: Result<Tensor>, needle: &str) {
    let m = msg(r);
    assert!(
        m.contains(needle),
        "error {m:?} does not mention {needle:?}"
    );
    assert!(m.starts_with("flashcore-candle: "), "{m}");
}

#[test]
fn dense_errors() {
    let q = h(&[2, 17, 8, 64]);
    let kv = h(&[2, 17, 2, 64]);
    let f = |q: &Tensor, k: &Tensor, v: &Tensor| flash_attn(q, k, v, 0.125, true);
    expect(
        f(&q.to_dtype(DType::F32).unwrap(), &kv, &kv),
        "q: dtype F32",
    );
    expect(
        f(&q, &t(&[2, 17, 2, 64], DType::BF16), &kv),
        "k: dtype BF16 differs",
    );
    expect(f(&h(&[17, 8, 64]), &kv, &kv), "q: expected rank 4");
    expect(f(&q, &h(&[17, 2, 64]), &kv), "k: expected rank 4");
    expect(f(&q, &kv, &h(&[17, 2, 64])), "v: expected rank 4");
    expect(f(&q, &kv, &h(&[2, 18, 2, 64])), "v: shape");
    expect(
        f(&q, &h(&[2, 17, 2, 128]), &h(&[2, 17, 2, 128])),
        "k: head_dim 128",
    );
    expect(
        f(&q, &h(&[3, 17, 2, 64]), &h(&[3, 17, 2, 64])),
        "k: batch 3",
    );
    // flashcore's own rules, checked on the call the op would make.
    let d80 = h(&[2, 17, 2, 80]);
    expect(
        f(&h(&[2, 17, 8, 80]), &d80, &d80),
        "`head_dim`: 80 is not supported",
    );
    let h3 = h(&[2, 17, 3, 64]);
    expect(f(&q, &h3, &h3), "`heads_kv`");
    let empty = h(&[2, 0, 2, 64]);
    expect(f(&q, &empty, &empty), "`seqlen_k`: must be at least 1");
    expect(flash_attn(&q, &kv, &kv, -1.0, false), "`scale`");
    expect(
        flash_attn_alibi_windowed_softcap(&q, &kv, &kv, None, 0.1, None, None, -2.0),
        "`softcap`",
    );
    // ALiBi is not implemented.
    let slopes = t(&[8], DType::F32);
    expect(flash_attn_alibi(&q, &kv, &kv, &slopes, 0.1, false), "ALiBi");
    expect(
        flash_attn_alibi_windowed_softcap(&q, &kv, &kv, Some(&slopes), 0.1, None, None, 0.0),
        "ALiBi",
    );
    // A valid call on CPU tensors: the device is the last check.
    expect(f(&q, &kv, &kv), "q is on Cpu");
    expect(
        flash_attn_windowed(&q, &kv, &kv, 0.1, Some(4), Some(0)),
        "q is on Cpu",
    );
    if !cfg!(feature = "cuda") {
        expect(f(&q, &kv, &kv), "this build has no `cuda` feature");
    }
}

#[test]
fn dense_spec_maps_windows_like_flash_attn() {
    let q = h(&[1, 5, 4, 64]);
    let kv = h(&[1, 9, 4, 64]);
    let s = DenseSpec::new(&q, &kv, &kv, 0.5, Some(3), Some(0), 0.0).unwrap();
    assert!(s.params.causal, "a right window of 0 is causal");
    assert_eq!(
        (s.params.window.left, s.params.window.right),
        (Some(3), None)
    );
    let s = DenseSpec::new(&q, &kv, &kv, 0.5, None, Some(2), 30.0).unwrap();
    assert!(!s.params.causal);
    assert_eq!(s.params.window.right, Some(2));
    assert_eq!(s.params.softcap, 30.0);
    assert_eq!(
        (s.params.seqlen_q, s.params.seqlen_k, s.params.scale),
        (5, 9, Some(0.5))
    );
}

#[test]
fn varlen_errors() {
    let q = h(&[30, 8, 64]);
    let kv = h(&[40, 2, 64]);
    let cu = Tensor::new(&[0u32, 10, 30], &Device::Cpu).unwrap();
    let cuk = Tensor::new(&[0u32, 15, 40], &Device::Cpu).unwrap();
    let f = |q: &Tensor, k: &Tensor, v: &Tensor, sq: &Tensor, sk: &Tensor, mq: usize| {
        flash_attn_varlen(q, k, v, sq, sk, mq, 25, 0.125, true)
    };
    expect(
        f(&h(&[1, 30, 8, 64]), &kv, &kv, &cu, &cuk, 20),
        "q: expected rank 3",
    );
    expect(
        f(&q, &h(&[40, 2, 128]), &h(&[40, 2, 128]), &cu, &cuk, 20),
        "k: head_dim",
    );
    expect(f(&q, &kv, &h(&[41, 2, 64]), &cu, &cuk, 20), "v: shape");
    expect(
        f(&q, &kv, &kv, &cu.reshape((3, 1)).unwrap(), &cuk, 20),
        "seqlens_q: expected rank 1",
    );
    expect(
        f(&q, &kv, &kv, &cu, &cuk.to_dtype(DType::F32).unwrap(), 20),
        "seqlens_k: dtype F32",
    );
    let short = Tensor::new(&[0u32, 30], &Device::Cpu).unwrap();
    expect(f(&q, &kv, &kv, &short, &cuk, 20), "seqlens_k: 3 entries");
    let one = Tensor::new(&[0u32], &Device::Cpu).unwrap();
    expect(f(&q, &kv, &kv, &one, &one, 20), "at least one sequence");
    expect(
        f(&q, &kv, &kv, &cu, &cuk, 0),
        "`seqlen_q`: must be at least 1",
    );
    // i32 lengths are accepted like u32.
    let cu_i = cu.to_dtype(DType::I64).unwrap();
    expect(f(&q, &kv, &kv, &cu_i, &cuk, 20), "seqlens_q: dtype I64");
    expect(f(&q, &kv, &kv, &cu, &cuk, 20), "q is on Cpu");
}

#[test]
fn kvcache_errors() {
    let q = h(&[2, 1, 8, 64]);
    let cache = h(&[2, 256, 2, 64]);
    let lens = Tensor::new(&[5u32, 9], &Device::Cpu).unwrap();
    let new = h(&[2, 1, 2, 64]);
    type Args<'a> = (
        &'a Tensor,
        &'a Tensor,
        &'a Tensor,
        Option<&'a Tensor>,
        Option<&'a Tensor>,
        &'a Tensor,
        Option<&'a Tensor>,
    );
    let f = |a: Args| flash_attn_with_kvcache(a.0, a.1, a.2, a.3, a.4, a.5, a.6, 0.125, true);
    expect(
        f((&q, &cache, &cache, Some(&new), None, &lens, None)),
        "given together",
    );
    expect(
        f((
            &q,
            &cache,
            &cache,
            Some(&new),
            Some(&t(&[2, 1, 2, 64], DType::BF16)),
            &lens,
            None,
        )),
        "v: dtype BF16 differs",
    );
    expect(
        f((&h(&[2, 8, 64]), &cache, &cache, None, None, &lens, None)),
        "q: expected rank 4",
    );
    expect(
        f((&q, &h(&[2, 256, 128]), &cache, None, None, &lens, None)),
        "k_cache: expected rank 4",
    );
    expect(
        f((&q, &cache, &h(&[2, 128, 2, 64]), None, None, &lens, None)),
        "v_cache: shape",
    );
    expect(
        f((
            &q,
            &cache,
            &cache,
            None,
            None,
            &lens.reshape((2, 1)).unwrap(),
            None,
        )),
        "cache_seqlens: expected rank 1",
    );
    expect(
        f((
            &q,
            &cache,
            &cache,
            None,
            None,
            &lens.to_dtype(DType::F32).unwrap(),
            None,
        )),
        "cache_seqlens: dtype F32",
    );
    let three = Tensor::new(&[1u32, 2, 3], &Device::Cpu).unwrap();
    expect(
        f((&q, &cache, &cache, None, None, &three, None)),
        "cache_seqlens: 3 entries",
    );
    let big = h(&[3, 256, 2, 64]);
    expect(
        f((&q, &big, &big, None, None, &lens, None)),
        "k_cache: batch 3",
    );
    // Paged: pools [num_pages, page_size, heads_kv, head_dim] and a [batch, pages] table.
    let pool = h(&[16, 16, 2, 64]);
    let table = Tensor::zeros((2, 4), DType::U32, &Device::Cpu).unwrap();
    expect(
        f((
            &q,
            &pool,
            &pool,
            None,
            None,
            &lens,
            Some(&table.reshape(8).unwrap()),
        )),
        "block_table: expected rank 2",
    );
    expect(
        f((
            &q,
            &pool,
            &pool,
            None,
            None,
            &lens,
            Some(&table.to_dtype(DType::F32).unwrap()),
        )),
        "block_table: dtype F32",
    );
    let table3 = Tensor::zeros((3, 4), DType::U32, &Device::Cpu).unwrap();
    expect(
        f((&q, &pool, &pool, None, None, &lens, Some(&table3))),
        "block_table: 3 rows",
    );
    // Pages of any size of at least one row: none is an error.
    let empty_pool = h(&[16, 0, 2, 64]);
    expect(
        f((
            &q,
            &empty_pool,
            &empty_pool,
            None,
            None,
            &lens,
            Some(&table),
        )),
        "page",
    );
    // The caches are used in place: a layout TMA cannot read is an error, not a copy.
    let strided = h(&[2, 256, 4, 64])
        .narrow(2, 1, 2)
        .unwrap()
        .narrow(3, 0, 64)
        .unwrap();
    let bcast = h(&[1, 256, 2, 64]).broadcast_as((2, 256, 2, 64)).unwrap();
    expect(
        f((&q, &bcast, &cache, None, None, &lens, None)),
        "k_cache: layout",
    );
    f((&q, &strided, &strided, None, None, &lens, None)).unwrap_err();
    expect(
        f((
            &q,
            &cache,
            &cache,
            Some(&h(&[2, 1, 4, 64])),
            Some(&h(&[2, 1, 4, 64])),
            &lens,
            None,
        )),
        "k: shape [2, 1, 4, 64]",
    );
    expect(
        f((&h(&[2, 17, 8, 64]), &cache, &cache, None, None, &lens, None)),
        "at most 16",
    );
    expect(
        f((
            &q,
            &cache,
            &cache,
            Some(&h(&[2, 300, 2, 64])),
            Some(&h(&[2, 300, 2, 64])),
            &lens,
            None,
        )),
        "`append`",
    );
    expect(
        f((&q, &cache, &cache, Some(&new), Some(&new), &lens, None)),
        "q is on Cpu",
    );
    expect(
        f((&q, &pool, &pool, None, None, &lens, Some(&table))),
        "q is on Cpu",
    );
}

#[test]
fn in_place_layouts() {
    let dense = Layout::contiguous((2, 100, 8, 64));
    assert!(!needs_copy(&dense), "contiguous");
    // q out of a fused [b, s, 3·h, d] projection: narrow on the head dim keeps TMA's rules.
    let fused = Layout::contiguous((2, 100, 24, 64));
    assert!(!needs_copy(&fused.narrow(2, 8, 8).unwrap()));
    // [b, h, s, d] transposed to [b, s, h, d]: strides permuted, still in place.
    let bhsd = Layout::contiguous((2, 8, 100, 64));
    assert!(!needs_copy(&bhsd.transpose(1, 2).unwrap()));
    // Copies: a non-contiguous head dim, a broadcast, an odd start, an odd row stride.
    assert!(needs_copy(&dense.transpose(2, 3).unwrap()));
    let b1 = Layout::contiguous((1, 100, 8, 64));
    assert!(needs_copy(&b1.broadcast_as((2, 100, 8, 64)).unwrap()));
    assert!(needs_copy(
        &Layout::contiguous((2, 100, 8, 65))
            .narrow(3, 1, 64)
            .unwrap()
    ));
    assert!(needs_copy(
        &Layout::contiguous((2, 100, 8, 68))
            .narrow(3, 0, 64)
            .unwrap()
    ));
    // A dim of extent 1 may carry any stride.
    let one = Layout::contiguous((1, 1, 8, 64));
    assert!(!needs_copy(&one));
}
