//! The fused KV-cache append (`kernels/fc_kv_append.cuh`): a decode step's new keys and values
//! written into the cache by a launch of its own, right before the attention on the same
//! stream, with each sequence's key count after the append written to a small device buffer
//! that the attention then reads. flash-attn's `flash_attn_with_kvcache(k=, v=)` semantics: row
//! `i` of sequence `b`'s new K/V goes to cache row `cache_seqlens[b] + i`; rows that would land
//! past the capacity are dropped (the caller's error, as in flash-attn), never written out of
//! bounds.
//!
//! The counts and the block table address the rows written, so they are public metadata here in
//! every KV-cache kind (docs/security.md): the audit declares both pointers of the append kernel's
//! parameter block public and proves that the K/V values reach no address or branch.

use crate::abi::AppendParams;
use crate::error::Result;
use crate::spec::DeviceTensor;
use cudarc::driver::{sys, CudaFunction};

/// New K/V rows to append before a KV-cache call (`ExternalCall::append`).
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
