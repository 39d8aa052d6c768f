//! Chunked prefill over a KV cache: many new queries per sequence — a long prompt
//! split into chunks, or new tokens after a reused prefix — attending to a cache plus
//! themselves. The varlen kernel reads the cache in place: sequence `b` is the slice of one
//! pack that starts at row `b · capacity`, and its key count is the varlen `seqused_k`, so
//! nothing is copied and nothing synchronises with the host. A paged cache is that pack too,
//! its rows found through the block table by the kernel (TMA boxes for pages that are powers
//! of two of at least 16 rows, a row-by-row gather for any other size: the same bits). Because
//! each query row is computed over the same key blocks in the same order as in a one-shot varlen
//! prefill of the whole sequence, a prompt prefilled chunk by chunk gets that prefill's bits
//! (GPU-tested).

use cudarc::driver::CudaSlice;

use super::call::{Call, Keys, KvCache};
use super::context::{Context, Element};
use crate::error::{Error, Result};
use crate::spec::{AttentionParams, Layout};

impl Context {
    /// Chunked prefill: `q` is packed `[total_q, heads_q, head_dim]` by `cu_seqlens_q` (i32
    /// `[batch + 1]` on the device, public metadata); sequence `b`'s queries are the last
    /// positions of its first `cache.seqlens_k[b]` cache rows (append them first:
    /// [`Context::append_kv`]), causal bottom-right aligned to that count. `params.seqlen_q` is
    /// the longest chunk (max_seqlen_q), `params.seqlen_k` the cache's capacity; heads, head dim,
    /// dtype and scale as for [`Context::attention`]; `params.window`, `params.softcap` and
    /// `cache.sinks` apply, the window aligned to each sequence's count. `out` is packed like `q`; `lse`, when
    /// given, fp32 `[heads_q, total_q]`. Takes bshd caches with public counts, contiguous
    /// `[batch, capacity, heads_kv, head_dim]` or paged (pools
    /// `[num_pages, page_size, heads_kv, head_dim]`, any page size, behind a block table
    /// `[batch, capacity / page_size]`, read through the table by the kernel: the bits of the
    /// same cache stored contiguously); secret counts, left padding and the
    /// prefill-consistent mode (chunks already get the prefill's bits) are refused — not built
    /// on this path yet. Counts and table entries are not read back: counts past the capacity
    /// are clamped on the device, and entries into the pool.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_kv_chunked<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        cache: &KvCache<'_, T>,
        cu_seqlens_q: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let call = Call::new(
            params,
            q,
            Keys::KvChunked {
                cache: *cache,
                cu_seqlens_q,
            },
        );
        self.run(&call, out, lse)
    }

    /// Chunked prefill over a cache ([`Keys::KvChunked`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kv_chunked<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        cache: &KvCache<'_, T>,
        cu_seqlens_q: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        check_chunked_cache(params, cache)?;
        let capacity = params.seqlen_k;
        let starts = (0..=params.batch)
            .map(|b| i32::try_from(b * capacity))
            .collect::<std::result::Result<Vec<i32>, _>>()
            .map_err(|_| {
                Error::invalid(
                    "seqlen_k",
                    "batch × capacity rows must index in i32 (the varlen pack's limit)",
                )
            })?;
        let cu_seqlens_k = self.upload(&starts)?;
        // A paged cache's rows are found through the table in the kernel: the offsets above
        // are the virtual pack's (`VarlenPages`), whatever page holds a row.
        self.varlen_device(
            params,
            q,
            [cache.k, cache.v],
            cache.block_table,
            [cu_seqlens_q, &cu_seqlens_k],
            [Some(cache.seqlens_k), None],
            cache.sinks,
            out,
            lse,
        )
    }
}

/// What the chunked path takes of a [`KvCache`] (the rest is checked as a varlen call; a paged
/// cache's pools and table by the varlen call too).
fn check_chunked_cache<T>(params: &AttentionParams, cache: &KvCache<'_, T>) -> Result<()> {
    let refuse = |arg: &'static str, what: &str| {
        Err(Error::invalid(
            arg,
            format!("{what} is not supported by chunked prefill over a cache yet"),
        ))
    };
    if cache.secret_lengths {
        return refuse("secret_lengths", "a secret count");
    }
    if cache.leftpad.is_some() {
        return refuse("leftpad", "left padding");
    }
    if cache.prefill_consistent {
        return refuse("prefill_consistent", "the prefill-consistent mode");
    }
    if params.layout != Layout::Bshd {
        return refuse("layout", "a bhsd layout");
    }
    cache.check_counts(params.batch)
}
