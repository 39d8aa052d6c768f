//! One description of a forward call on [`Context`] buffers, and its one entry point,
//! [`Context::run`]; the backward of that call is the same description with the forward's
//! output and the output gradient ([`BackwardCall`]), run by [`Context::run_backward`]. The
//! `attention*` methods are shorthands that build a [`Call`] or a [`BackwardCall`] and run it.
//!
//! ```no_run
//! use flashcore::attention::{AttentionParams, Call, Context, Keys};
//! # fn demo(ctx: &Context, q: &cudarc::driver::CudaSlice<half::f16>,
//! #         k: &cudarc::driver::CudaSlice<half::f16>, v: &cudarc::driver::CudaSlice<half::f16>,
//! #         out: &mut cudarc::driver::CudaSlice<half::f16>) -> flashcore::Result<()> {
//! let p = AttentionParams::new(2, 8, 1024, 64).causal(true);
//! ctx.run(&Call::new(&p, q, Keys::Dense { k, v }), out, None)?;
//! # Ok(()) }
//! ```

use super::device::{Context, Element};
use crate::error::{Error, Result};
use crate::spec::{AttentionParams, Lengths, Pages};
use cudarc::driver::CudaSlice;

/// Where a call's keys and values come from, and what is known of each sequence's length.
#[derive(Clone, Copy)]
pub enum Keys<'a, T> {
    /// Dense K and V, `[batch, seqlen_k, heads_kv, head_dim]` in `params.layout`.
    Dense {
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
    },
    /// Dense, with each sequence's true length secret (i32 `[batch]`, on the device): the work,
    /// control flow and addresses are those of the padded shape.
    SecretLen {
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        lengths: &'a CudaSlice<i32>,
    },
    /// A few new queries per sequence over a KV cache (decode).
    KvCache(KvCache<'a, T>),
    /// Packed new queries (`cu_seqlens_q`, i32 `[batch + 1]`) over a KV cache, contiguous or
    /// paged: chunked prefill.
    KvChunked {
        cache: KvCache<'a, T>,
        cu_seqlens_q: &'a CudaSlice<i32>,
    },
    /// Packed sequences (`[total, heads, head_dim]`), offsets i32 `[batch + 1]` on the device,
    /// optionally each sequence's used keys and queries (i32 `[batch]`).
    Varlen {
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        cu_seqlens_q: &'a CudaSlice<i32>,
        cu_seqlens_k: &'a CudaSlice<i32>,
        seqused_k: Option<&'a CudaSlice<i32>>,
        seqused_q: Option<&'a CudaSlice<i32>>,
    },
    /// Packed sequences with offsets on the host: checked there, and the work list built there
    /// (no synchronisation).
    VarlenHost {
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        cu_seqlens_q: &'a [i32],
        cu_seqlens_k: &'a [i32],
    },
    /// Packed sequences in fixed slots (`cu_seqlens`, public) with secret true lengths (i32
    /// `[batch]`, on the device).
    VarlenSecretLen {
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        cu_seqlens: &'a CudaSlice<i32>,
        lengths: &'a CudaSlice<i32>,
    },
}

/// One forward call: the shape and options (`params`), the queries, the keys and values, and
/// optional learnable attention sinks (fp32 `[heads_q]`, gpt-oss).
#[derive(Clone, Copy)]
pub struct Call<'a, T> {
    pub params: &'a AttentionParams,
    pub q: &'a CudaSlice<T>,
    pub keys: Keys<'a, T>,
    pub sinks: Option<&'a CudaSlice<f32>>,
}

impl<'a, T> Call<'a, T> {
    pub fn new(params: &'a AttentionParams, q: &'a CudaSlice<T>, keys: Keys<'a, T>) -> Self {
        Call {
            params,
            q,
            keys,
            sinks: None,
        }
    }

    /// The same call with learnable sinks: one fp32 logit per query head joins every row's
    /// softmax denominator (see [`Context::attention_with_sinks`]).
    pub fn sinks(self, sinks: &'a CudaSlice<f32>) -> Self {
        Call {
            sinks: Some(sinks),
            ..self
        }
    }
}

impl Context {
    /// Runs `call` on this context's stream: O (and, when given, the fp32 log-sum-exp `lse`) of
    /// the forward it describes. Every rule is checked before the launch.
    pub fn run<T: Element>(
        &self,
        call: &Call<'_, T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let (p, q, sinks) = (call.params, call.q, call.sinks);
        let refuse_sinks = |mode: &str| {
            Err(Error::invalid(
                "sinks",
                format!("attention sinks are not supported with {mode}"),
            ))
        };
        match call.keys {
            Keys::Dense { k, v } => self.dense(p, q, k, v, sinks, out, lse),
            Keys::SecretLen { k, v, lengths } => match sinks {
                Some(_) => refuse_sinks("secret lengths"),
                None => self.secret_len(p, q, k, v, lengths, out, lse),
            },
            Keys::KvCache(cache) => {
                let cache = with_sinks(cache, sinks)?;
                self.kv_cache(p, q, &cache, out, lse)
            }
            Keys::KvChunked {
                cache,
                cu_seqlens_q,
            } => {
                let cache = with_sinks(cache, sinks)?;
                self.kv_chunked(p, q, &cache, cu_seqlens_q, out, lse)
            }
            Keys::Varlen {
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_k,
                seqused_k,
                seqused_q,
            } => self.varlen_device(
                p,
                q,
                [k, v],
                None,
                [cu_seqlens_q, cu_seqlens_k],
                [seqused_k, seqused_q],
                sinks,
                out,
                lse,
            ),
            Keys::VarlenHost {
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_k,
            } => self.varlen_host(p, q, [k, v], [cu_seqlens_q, cu_seqlens_k], sinks, out, lse),
            Keys::VarlenSecretLen {
                k,
                v,
                cu_seqlens,
                lengths,
            } => match sinks {
                Some(_) => refuse_sinks("secret lengths"),
                None => self.varlen_secret_len(p, q, k, v, cu_seqlens, lengths, out, lse),
            },
        }
    }
}

/// The backward of one forward call: that call's description (`forward`: params, q, keys and
/// sinks), the output `o` and log-sum-exp `lse` it wrote, and the output gradient `d_o` (q's
/// shape). Dense keys ([`Keys::Dense`], every buffer contiguous in `params.layout`) and packed
/// sequences with device offsets ([`Keys::Varlen`], `lse` fp32 `[heads_q, total_q]`) have a
/// backward; the other kinds of keys are refused.
///
/// ```no_run
/// use flashcore::attention::{AttentionParams, BackwardCall, Call, Context, Grads, Keys};
/// # use cudarc::driver::CudaSlice; use half::f16;
/// # fn demo(ctx: &Context, q: &CudaSlice<f16>, k: &CudaSlice<f16>, v: &CudaSlice<f16>,
/// #         o: &CudaSlice<f16>, lse: &CudaSlice<f32>, d_o: &CudaSlice<f16>,
/// #         dq: &mut CudaSlice<f16>, dk: &mut CudaSlice<f16>, dv: &mut CudaSlice<f16>)
/// #         -> flashcore::Result<()> {
/// let p = AttentionParams::new(2, 8, 1024, 64).causal(true);
/// let forward = Call::new(&p, q, Keys::Dense { k, v });
/// ctx.run_backward(&BackwardCall::new(forward, o, Some(lse), d_o), Grads::new(dq, dk, dv))?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct BackwardCall<'a, T, U = T> {
    pub forward: Call<'a, T>,
    pub o: &'a CudaSlice<T>,
    /// The forward's log-sum-exp (fp32): required; `None` is refused with the rule.
    pub lse: Option<&'a CudaSlice<f32>>,
    pub d_o: &'a CudaSlice<U>,
}

impl<'a, T, U> BackwardCall<'a, T, U> {
    pub fn new(
        forward: Call<'a, T>,
        o: &'a CudaSlice<T>,
        lse: Option<&'a CudaSlice<f32>>,
        d_o: &'a CudaSlice<U>,
    ) -> Self {
        BackwardCall {
            forward,
            o,
            lse,
            d_o,
        }
    }
}

/// What a backward call writes: `dq` (q's shape), `dk` and `dv` (k's; GQA: summed over each K/V
/// head's query heads) and, for a forward with sinks, their gradient `dsink` (fp32 `[heads_q]`).
pub struct Grads<'a, T> {
    pub dq: &'a mut CudaSlice<T>,
    pub dk: &'a mut CudaSlice<T>,
    pub dv: &'a mut CudaSlice<T>,
    pub dsink: Option<&'a mut CudaSlice<f32>>,
}

impl<'a, T> Grads<'a, T> {
    pub fn new(
        dq: &'a mut CudaSlice<T>,
        dk: &'a mut CudaSlice<T>,
        dv: &'a mut CudaSlice<T>,
    ) -> Self {
        Grads {
            dq,
            dk,
            dv,
            dsink: None,
        }
    }

    /// The same gradients with the sinks' gradient written into `dsink`.
    pub fn dsink(self, dsink: &'a mut CudaSlice<f32>) -> Self {
        Grads {
            dsink: Some(dsink),
            ..self
        }
    }
}

impl Context {
    /// Runs the backward `call` on this context's stream: dQ, dK, dV (and dsink) of the forward
    /// it describes, bitwise deterministic and batch-invariant. Every rule is checked before the
    /// launch: a wrong dtype (`d_o` included), a wrong length, a missing `lse`, or sinks without
    /// `dsink` (or the reverse) is an [`Error::InvalidArgument`] naming the argument.
    pub fn run_backward<T: Element, U: Element>(
        &self,
        call: &BackwardCall<'_, T, U>,
        grads: Grads<'_, T>,
    ) -> Result<()> {
        let f = &call.forward;
        let (p, q, o, d_o) = (f.params, f.q, call.o, call.d_o);
        let Grads { dq, dk, dv, dsink } = grads;
        let no_backward = |what: &str| {
            Err(Error::invalid(
                "keys",
                format!("{what} have no backward pass"),
            ))
        };
        match f.keys {
            Keys::Dense { k, v } => {
                self.backward_checked(p, q, k, v, o, call.lse, d_o, dq, dk, dv, f.sinks, dsink)
            }
            Keys::Varlen {
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_k,
                seqused_k,
                seqused_q,
            } => {
                let lse = call.lse.ok_or_else(|| {
                    Error::invalid(
                        "lse",
                        "the backward needs the forward's log-sum-exp (f32 [heads_q, total_q]): \
                         pass the `lse` the forward wrote",
                    )
                })?;
                self.varlen_backward_checked(
                    p,
                    [q, k, v],
                    [cu_seqlens_q, cu_seqlens_k],
                    [seqused_k, seqused_q],
                    o,
                    d_o,
                    lse,
                    f.sinks,
                    dsink,
                    [dq, dk, dv],
                )
            }
            Keys::SecretLen { .. } | Keys::VarlenSecretLen { .. } => {
                no_backward("calls with secret lengths")
            }
            Keys::KvCache(_) | Keys::KvChunked { .. } => no_backward("calls over a KV cache"),
            Keys::VarlenHost { .. } => Err(Error::invalid(
                "keys",
                "the varlen backward reads the offsets on the device: describe the call with \
                 `Keys::Varlen`",
            )),
        }
    }
}

/// A cache's sinks come from the cache or from the call, not both.
fn with_sinks<'a, T>(
    cache: KvCache<'a, T>,
    sinks: Option<&'a CudaSlice<f32>>,
) -> Result<KvCache<'a, T>> {
    match (cache.sinks, sinks) {
        (Some(_), Some(_)) => Err(Error::invalid(
            "sinks",
            "given twice: on the call and on the cache",
        )),
        (None, Some(s)) => Ok(cache.sinks(s)),
        _ => Ok(cache),
    }
}

/// A KV cache on the device, as [`Context::attention_kv_cache`] reads it.
#[derive(Clone, Copy)]
pub struct KvCache<'a, T> {
    /// Contiguous: `[batch, seqlen_k, heads_kv, head_dim]` in the call's layout; paged: the pool,
    /// `[num_pages, page_size, heads_kv, head_dim]`.
    pub k: &'a CudaSlice<T>,
    pub v: &'a CudaSlice<T>,
    /// i32 per sequence: how many of its cache rows are keys (after this step's append).
    pub seqlens_k: &'a CudaSlice<i32>,
    /// Paged: the block table (i32 `[batch, seqlen_k / page_size]`) and the pool's geometry.
    pub block_table: Option<(&'a CudaSlice<i32>, Pages)>,
    /// Keep the counts secret: the kernel walks the capacity and masks by select.
    pub secret_lengths: bool,
    /// i32 per sequence: its first key (flash-attn's `cache_leftpad`, left padding): keys before
    /// it are masked; `seqlens_k` stays the end of the range. None: every sequence starts at 0.
    pub leftpad: Option<&'a CudaSlice<i32>>,
    /// Prefill-consistent: one work unit per query tile over the whole cache instead of splits,
    /// so a query row gets exactly the bits of that row of a causal prefill over the same keys
    /// (what RL rollouts need to match the training forward). Slower where the splits would
    /// have filled the GPU (few sequences over long caches): docs/journal/benchmarks.md "KV cache".
    pub prefill_consistent: bool,
    /// Learnable attention sinks (fp32 `[heads_q]`, gpt-oss), as [`Context::attention_with_sinks`].
    pub sinks: Option<&'a CudaSlice<f32>>,
}

impl<'a, T> KvCache<'a, T> {
    /// The same cache read with learnable sinks (one fp32 logit per query head).
    pub fn sinks(self, sinks: &'a CudaSlice<f32>) -> Self {
        KvCache {
            sinks: Some(sinks),
            ..self
        }
    }
    /// A contiguous cache with public counts.
    pub fn contiguous(
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        seqlens_k: &'a CudaSlice<i32>,
    ) -> Self {
        KvCache {
            k,
            v,
            seqlens_k,
            block_table: None,
            secret_lengths: false,
            leftpad: None,
            prefill_consistent: false,
            sinks: None,
        }
    }
    /// A paged cache with public counts.
    pub fn paged(
        k: &'a CudaSlice<T>,
        v: &'a CudaSlice<T>,
        seqlens_k: &'a CudaSlice<i32>,
        block_table: &'a CudaSlice<i32>,
        pages: Pages,
    ) -> Self {
        KvCache {
            block_table: Some((block_table, pages)),
            ..KvCache::contiguous(k, v, seqlens_k)
        }
    }
    /// The same cache with its counts kept secret.
    pub fn secret(self) -> Self {
        KvCache {
            secret_lengths: true,
            ..self
        }
    }
    /// The same cache with each sequence's keys starting at `leftpad[b]` (left padding).
    pub fn leftpad(self, leftpad: &'a CudaSlice<i32>) -> Self {
        KvCache {
            leftpad: Some(leftpad),
            ..self
        }
    }
    /// The same cache, read in the prefill-consistent mode.
    pub fn prefill_consistent(self) -> Self {
        KvCache {
            prefill_consistent: true,
            ..self
        }
    }
    /// One count per sequence of a batch of `batch`.
    pub(crate) fn check_counts(&self, batch: usize) -> Result<()> {
        if self.seqlens_k.len() != batch {
            return Err(Error::invalid(
                "seqlens_k",
                format!("has {} entries, batch is {batch}", self.seqlens_k.len()),
            ));
        }
        Ok(())
    }
    /// The plan's lengths mode for this cache.
    pub fn lengths(&self) -> Lengths {
        Lengths::KvCache {
            secret: self.secret_lengths,
            pages: self.block_table.map(|(_, pg)| pg),
            prefill_consistent: self.prefill_consistent,
        }
    }
}
