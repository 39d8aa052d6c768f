//! The fused KV-cache append (`kernels/fc_kv_append.cuh`): a decode step's new keys and values
//! written into the cache by a launch of its own, right before the attention on the same
//! stream, with each sequence's key count after the append written to a small device buffer
//! that the attention then reads. flash-attn's `flash_attn_with_kvcache(k=, v=)` semantics: row
//! `i` of sequence `b`'s new K/V goes to cache row `cache_seqlens[b] + i`; rows that would land
//! past the capacity are dropped (the caller's error, as in flash-attn), never written out of
//! bounds.
//!
//! The counts and the block table address the rows written, so they are public metadata here in
//! every KV-cache kind (SECURITY.md): the audit declares both pointers of the append kernel's
//! parameter block public and proves that the K/V values reach no address or branch.

use super::external::{DeviceTensor, ExternalCall};
use crate::abi::AppendParams;
use crate::error::{Error, Result};
use cudarc::driver::{sys, CudaFunction};

/// New K/V rows to append before a KV-cache call ([`ExternalCall::append`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvAppend {
    /// `[batch, rows, heads_kv, head_dim]` by their strides, the call's dtype.
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    /// New rows per sequence (≥ 1).
    pub rows: usize,
    /// i32 `[batch]` device buffer the append writes `cache_seqlens + rows` to; the attention
    /// reads its key counts from there. 4-byte aligned, used by no other launch in flight.
    pub counts: u64,
}

/// Threads per CTA of the append kernel (`APPEND_THREADS`).
const APPEND_THREADS: u32 = 256;

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
        page_shift: pages.map_or(0, |pg| pg.page_size.trailing_zeros() as i32),
        table_stride: pages.map_or(0, |pg| (p.seqlen_k / pg.page_size) as i32),
        num_pages: pages.map_or(0, |pg| pg.num_pages as i32),
    }
}

/// CTAs of the append kernel: one thread per 8 elements of every new K (and V) row, and at least
/// one per sequence for the counts.
pub(crate) fn ctas(ap: &AppendParams) -> u32 {
    let threads =
        (ap.batch as u64 * ap.rows as u64 * ap.heads_kv as u64 * (ap.head_dim as u64 / 8))
            .max(ap.batch as u64);
    threads.div_ceil(APPEND_THREADS as u64) as u32
}

/// Enqueues the append on `stream`.
///
/// # Safety
/// The block's pointers are live device memory covering what its strides reach, on the context
/// current on this thread, alive until the kernel ends.
pub(crate) unsafe fn launch(
    function: &CudaFunction,
    ap: &mut AppendParams,
    stream: sys::CUstream,
) -> Result<()> {
    let mut args: [*mut std::ffi::c_void; 1] = [ap as *mut AppendParams as *mut std::ffi::c_void];
    cudarc::driver::result::launch_kernel(
        function.cu_function(),
        (ctas(ap), 1, 1),
        (APPEND_THREADS, 1, 1),
        0,
        stream,
        &mut args,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{APPEND_TABLE_FIELD, SEQLENS_FIELD};

    #[test]
    fn grid_covers_every_row_chunk_and_every_count() {
        let mut ap = AppendParams {
            batch: 3,
            rows: 2,
            heads_kv: 8,
            head_dim: 128,
            ..Default::default()
        };
        assert_eq!(ctas(&ap), (3 * 2 * 8 * 16u32).div_ceil(256));
        ap.rows = 1;
        ap.heads_kv = 1;
        ap.head_dim = 64;
        ap.batch = 300; // 300 · 8 chunk threads
        assert_eq!(ctas(&ap), (300u32 * 8).div_ceil(256));
        assert_eq!(SEQLENS_FIELD, 32);
        assert_eq!(APPEND_TABLE_FIELD, 40);
    }
}
