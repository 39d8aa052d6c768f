//! The KV append as part of a call on caller-owned memory: its host-side rules and its
//! parameter block (the append kernel's launch: `kv_append.rs`).

use super::ExternalCall;
use crate::abi::AppendParams;
use crate::attention::kv_append::KvAppend;
use crate::error::{Error, Result};

/// Host-side rules of an append (no GPU): a KV-cache call, at least one row, the new tensors'
/// alignment (16-byte copies) and positive strides, an aligned counts buffer distinct from the
/// input counts.
pub(crate) fn validate(call: &ExternalCall, a: &KvAppend) -> Result<()> {
    if call.kv_lengths == 0 {
        return Err(Error::invalid(
            "append",
            "appending new keys and values needs KV-cache key counts (cache_seqlens)",
        ));
    }
    if a.rows == 0 || a.rows > call.params.seqlen_k {
        return Err(Error::invalid(
            "append",
            format!(
                "{} new rows per sequence: must be at least 1 and at most the cache capacity {}",
                a.rows, call.params.seqlen_k
            ),
        ));
    }
    let p = &call.params;
    let threads = p.batch as u128 * a.rows as u128 * p.heads_kv as u128 * (p.head_dim / 8) as u128;
    if threads > i32::MAX as u128 {
        return Err(Error::invalid(
            "append",
            "too many new rows for one append: batch · rows · heads_kv · head_dim / 8 must fit in an i32",
        ));
    }
    let esize = call.params.dtype.size() as u64;
    for (name, t) in [("k", &a.k), ("v", &a.v)] {
        if t.ptr == 0 || t.ptr % 16 != 0 {
            return Err(Error::invalid(
                name,
                "new rows need a non-null, 16-byte aligned device address",
            ));
        }
        for s in t.strides.as_array() {
            if s <= 0 || (s as u64 * esize) % 16 != 0 {
                return Err(Error::invalid(
                    name,
                    format!("new rows' stride {s} elements is not a positive multiple of 16 bytes"),
                ));
            }
        }
    }
    if a.counts == 0 || a.counts % 4 != 0 || a.counts == call.kv_lengths {
        return Err(Error::invalid(
            "append",
            "the counts buffer must be a non-null, 4-byte aligned device address other than cache_seqlens",
        ));
    }
    Ok(())
}

/// The parameter block for `call`'s append (validated), caches by `cache_strides` (K, V).
pub(crate) fn params(
    call: &ExternalCall,
    a: &KvAppend,
    cache_strides: [[i64; 3]; 2],
) -> AppendParams {
    let p = &call.params;
    let pages = call.pages;
    AppendParams {
        k_new: a.k.ptr,
        v_new: a.v.ptr,
        k_cache: call.k.ptr,
        v_cache: call.v.ptr,
        seqlens_ptr: call.kv_lengths,
        table_ptr: if pages.is_some() { call.block_table } else { 0 },
        counts_ptr: a.counts,
        k_new_stride: a.k.strides.as_array(),
        v_new_stride: a.v.strides.as_array(),
        k_cache_stride: cache_strides[0],
        v_cache_stride: cache_strides[1],
        batch: p.batch as i32,
        rows: a.rows as i32,
        heads_kv: p.heads_kv as i32,
        head_dim: p.head_dim as i32,
        capacity: p.seqlen_k as i32,
        page_size: pages.map_or(0, |pg| pg.page_size as i32),
        table_stride: pages.map_or(0, |pg| (p.seqlen_k / pg.page_size) as i32),
        num_pages: pages.map_or(0, |pg| pg.num_pages as i32),
        page_mul: pages.map_or(0, |pg| pg.divisor().0),
        page_div_shift: pages.map_or(0, |pg| pg.divisor().1),
    }
}
