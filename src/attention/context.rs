//! The attention API of a [`Context`]: plans and launches of the dense, secret-length and
//! KV-cache forward (one description of a call and its entry point: `call.rs`) (the device itself: `device.rs`).

use super::call::{Call, Keys, KvCache};
use super::launch::Plan;
use super::validate;
use crate::error::{Error, Result};
use crate::kernels::TestBuild;
use crate::spec::AttentionParams;
use crate::spec::Lengths;
use crate::spec::Pages;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

pub(crate) use super::device::probe_driver;
pub use super::device::{Context, Element};

impl Context {
    /// Validates `params` and prepares everything a launch needs except the buffers.
    pub fn plan(&self, params: &AttentionParams) -> Result<Plan> {
        self.plan_lengths(params, Lengths::None, true)
    }

    /// A plan for calls that bring their own decode workspace ([`super::external`]): it
    /// allocates none.
    pub(crate) fn plan_external(&self, params: &AttentionParams) -> Result<Plan> {
        self.plan_lengths(params, Lengths::None, false)
    }

    /// A KV-cache plan ([`Lengths::KvCache`]): `params.seqlen_k` is the cache's capacity,
    /// `params.seqlen_q` ≤ [`crate::spec::MAX_SEQLEN_Q`] the new queries; each launch gives
    /// every sequence's key count in a device buffer — public metadata, or with `secret` kept
    /// secret (the kernel walks the capacity). `pages`: a paged cache.
    pub fn plan_kv_cache(
        &self,
        params: &AttentionParams,
        secret: bool,
        pages: Option<Pages>,
    ) -> Result<Plan> {
        self.plan_lengths(params, Lengths::kv_cache(secret, pages), true)
    }

    /// Checks `params` for the lengths mode and makes the plan (shipped kernels only).
    pub(crate) fn plan_lengths(
        &self,
        params: &AttentionParams,
        lengths: Lengths,
        own_workspace: bool,
    ) -> Result<Plan> {
        validate::check_params(params)?;
        match lengths {
            Lengths::None => {}
            Lengths::SecretPadded => validate::check_secret_len(params)?,
            Lengths::KvCache { pages, .. } => {
                validate::check_kv_cache(params)?;
                if let Some(pg) = pages {
                    validate::check_pages(params, &pg)?;
                }
            }
        }
        Plan::new(
            self,
            params.clone(),
            lengths,
            TestBuild::default(),
            own_workspace,
        )
    }

    /// A plan in secret-length mode: the kernel walks the padded length `seqlen_q` = `seqlen_k`
    /// (public) and reads each batch entry's true length from device memory (secret).
    pub fn plan_secret_len(&self, params: &AttentionParams) -> Result<Plan> {
        self.plan_lengths(params, Lengths::SecretPadded, false)
    }

    /// A plan for one of the deliberately leaky control kernels (never used for real work): the
    /// timing-leakage test must be able to tell them from the shipped ones.
    /// `SkipPastSecretLength` runs in secret-length mode.
    #[doc(hidden)]
    pub fn plan_leaky_control(
        &self,
        params: &AttentionParams,
        control: crate::kernels::LeakyControl,
    ) -> Result<Plan> {
        validate::check_params(params)?;
        let secret_len = control == crate::kernels::LeakyControl::SkipPastSecretLength;
        if secret_len {
            validate::check_secret_len(params)?;
        }
        let build = TestBuild {
            leaky_control: Some(control),
            ..TestBuild::default()
        };
        let lengths = if secret_len {
            Lengths::SecretPadded
        } else {
            Lengths::None
        };
        Plan::new(self, params.clone(), lengths, build, true)
    }

    /// A plan for any build of the timing test (never used for real work): a leaky control, the
    /// hardware floor (the softmax sees a public pattern; loads and GEMMs are the shipped ones),
    /// the cycle timer (each CTA writes its clock readings to a buffer, see
    /// `crate::leakage::cycles`), in value or secret-length mode.
    #[doc(hidden)]
    pub fn plan_build(
        &self,
        params: &AttentionParams,
        secret_len: bool,
        build: TestBuild,
    ) -> Result<Plan> {
        validate::check_params(params)?;
        if secret_len {
            validate::check_secret_len(params)?;
        }
        let lengths = if secret_len {
            Lengths::SecretPadded
        } else {
            Lengths::None
        };
        Plan::new(self, params.clone(), lengths, build, true)
    }

    /// O = softmax(scale · Q Kᵀ + mask) V on this context's stream; `lse` (fp32 [B, Hq, Sq],
    /// natural log) is written when given. All checks happen before the launch. Shorthand for
    /// [`Context::run`] of a [`Keys::Dense`] call.
    pub fn attention<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        self.run(&Call::new(params, q, Keys::Dense { k, v }), out, lse)
    }

    /// As [`Context::attention`], with learnable attention sinks (gpt-oss): `sinks` holds one
    /// fp32 logit per query head, which joins every row's softmax denominator as `exp(sink)`
    /// with no value row (the LSE includes it; a row that sees no key gets O = 0, LSE = sink).
    /// The sinks are model weights and stay secret: the kernel only does arithmetic on them.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_with_sinks<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
        sinks: &CudaSlice<f32>,
    ) -> Result<()> {
        let call = Call::new(params, q, Keys::Dense { k, v }).sinks(sinks);
        self.run(&call, out, lse)
    }

    /// The dense forward ([`Keys::Dense`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dense<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        sinks: Option<&CudaSlice<f32>>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let plan = self.plan(params)?;
        self.launch_checked(&plan, params, q, k, v, out, lse, [0; 3], sinks)
    }

    /// Checks every buffer against the plan's shape (K and V against a paged plan's pools),
    /// then launches (with `lens` in a lengths mode, else 0; `table` for a paged plan, else 0;
    /// `starts` a KV cache's first keys, or 0).
    #[allow(clippy::too_many_arguments)]
    fn launch_checked<T: Element>(
        &self,
        plan: &Plan,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
        [lens, table, starts]: [u64; 3],
        sinks: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        validate::check_buffers_dtype(params, T::DTYPE)?;
        let align = validate::TENSOR_ALIGN;
        let (q_ptr, _g1) = q.device_ptr(self.stream());
        let (k_ptr, _g2) = k.device_ptr(self.stream());
        let (v_ptr, _g3) = v.device_ptr(self.stream());
        validate::check_buffer("q", q.len(), params.q_len(), q_ptr, align)?;
        // A paged plan's K and V are the page pools.
        let kv_len = match plan.lengths().pages() {
            Some(pg) => pg.pool_len(params),
            None => params.kv_len(),
        };
        validate::check_buffer("k", k.len(), kv_len, k_ptr, align)?;
        validate::check_buffer("v", v.len(), kv_len, v_ptr, align)?;
        let out_len = out.len();
        let (o_ptr, _g4) = out.device_ptr_mut(self.stream());
        validate::check_buffer("out", out_len, params.q_len(), o_ptr, 4)?;
        let lse_ptr = match lse {
            Some(l) => {
                let len = l.len();
                let (p, _g) = l.device_ptr_mut(self.stream());
                validate::check_buffer("lse", len, params.lse_len(), p, 4)?;
                p
            }
            None => 0,
        };
        let (sinks_ptr, _g5) = match sinks {
            Some(s) => {
                let (p, g) = s.device_ptr(self.stream());
                validate::check_buffer("sinks", s.len(), params.heads_q, p, 4)?;
                (p, Some(g))
            }
            None => (0, None),
        };
        // SAFETY: every buffer's length and alignment was checked against the plan's shape.
        unsafe {
            if sinks_ptr != 0 {
                plan.launch_raw_with_sinks(
                    q_ptr,
                    k_ptr,
                    v_ptr,
                    o_ptr,
                    lse_ptr,
                    [lens, table, starts],
                    sinks_ptr,
                )
            } else if matches!(plan.lengths(), Lengths::KvCache { .. }) {
                plan.launch_raw_kv_cache(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, lens, table, starts)
            } else if plan.secret_len() {
                plan.launch_raw_with_lengths(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, lens)
            } else {
                plan.launch_raw(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr)
            }
        }
    }

    /// Secret-length mode: like [`Context::attention`], with `lengths` (i32 per batch entry, on the
    /// device) giving each sequence's true length inside the padded one. Keys at or past it are
    /// masked, output rows at or past it are zero (LSE −inf); the work done, the control flow and
    /// every address are those of the padded shape, whatever the lengths.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_secret_len<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
        lengths: &CudaSlice<i32>,
    ) -> Result<()> {
        let call = Call::new(params, q, Keys::SecretLen { k, v, lengths });
        self.run(&call, out, lse)
    }

    /// The secret-length forward ([`Keys::SecretLen`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn secret_len<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        lengths: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        if lengths.len() != params.batch {
            return Err(Error::invalid(
                "lengths",
                format!("has {} entries, batch is {}", lengths.len(), params.batch),
            ));
        }
        let plan = self.plan_secret_len(params)?;
        let (lens_ptr, _g) = lengths.device_ptr(self.stream());
        self.launch_checked(&plan, params, q, k, v, out, lse, [lens_ptr, 0, 0], None)
    }

    /// Attention of a few new queries over a KV cache ([`Lengths::KvCache`], flash-attn's
    /// `flash_attn_with_kvcache` after its append): the queries are the last `params.seqlen_q`
    /// positions of each sequence's `cache.seqlens_k` keys, causal masks aligned to that count.
    /// `params.seqlen_k` is the capacity. Contiguous caches hold `[batch, seqlen_k, heads_kv,
    /// head_dim]` in `params.layout`; paged ones are pools read through a block table. The counts
    /// and the table are public metadata, checked on the host before the launch (counts within
    /// the capacity, pages inside the pool); with `cache.secret_lengths` the counts stay secret:
    /// time, control flow and addresses are those of the full capacity, and each count is
    /// clamped to [0, capacity] on the device. Append this step's keys first
    /// ([`Context::append_kv`]).
    pub fn attention_kv_cache<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        cache: &KvCache<'_, T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        self.run(&Call::new(params, q, Keys::KvCache(*cache)), out, lse)
    }

    /// The KV-cache forward ([`Keys::KvCache`]).
    pub(super) fn kv_cache<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        cache: &KvCache<'_, T>,
        out: &mut CudaSlice<T>,
        lse: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        cache.check_counts(params.batch)?;
        let pages = cache.block_table.map(|(_, pg)| pg);
        let plan = self.plan_lengths(params, cache.lengths(), true)?;
        let counts = self.download(cache.seqlens_k)?;
        let table = match cache.block_table {
            Some((t, _)) => Some(self.download(t)?),
            None => None,
        };
        validate::check_kv_metadata(
            params,
            &counts,
            table.as_deref().zip(pages.as_ref()),
            cache.secret_lengths,
        )?;
        if let Some(starts) = cache.leftpad {
            validate::check_kv_starts(&counts, &self.download(starts)?, cache.secret_lengths)?;
        }
        let (lens_ptr, _g) = cache.seqlens_k.device_ptr(self.stream());
        let table = cache.block_table.map(|(t, _)| t.device_ptr(self.stream()));
        let t_ptr = table.as_ref().map_or(0, |(p, _)| *p);
        let starts = cache.leftpad.map(|s| s.device_ptr(self.stream()));
        let s_ptr = starts.as_ref().map_or(0, |(p, _)| *p);
        // The table's entries were checked against the pool above (and are clamped on the device).
        self.launch_checked(
            &plan,
            params,
            q,
            cache.k,
            cache.v,
            out,
            lse,
            [lens_ptr, t_ptr, s_ptr],
            cache.sinks,
        )
    }

    /// Writes `new` (`[batch, n, heads_kv, head_dim]`, bshd) into a bshd `cache` of capacity
    /// `params.seqlen_k` at rows `cache_seqlens[b]..cache_seqlens[b] + n` of each sequence b
    /// (device copies on this context's stream). With `pages` (the host copy of the block table
    /// and the pool's geometry) `cache` is a page pool and row r of sequence b goes to page
    /// `table[b][r / page_size]`. The lengths and the table are host values: where a row goes is
    /// public here (docs/design.md §1: cache lengths are metadata); a row past the capacity or a page
    /// outside the pool is an error before any copy.
    pub fn append_kv<T: Element>(
        &self,
        params: &AttentionParams,
        cache: &mut CudaSlice<T>,
        new: &CudaSlice<T>,
        cache_seqlens: &[usize],
        pages: Option<(&[i32], Pages)>,
    ) -> Result<()> {
        if params.layout != crate::spec::Layout::Bshd {
            return Err(Error::invalid(
                "layout",
                "append_kv writes bshd caches only",
            ));
        }
        if params.batch == 0 || params.heads_kv == 0 || params.head_dim == 0 {
            return Err(Error::invalid(
                "params",
                "batch, heads_kv and head_dim must be positive",
            ));
        }
        if cache_seqlens.len() != params.batch {
            return Err(Error::invalid(
                "cache_seqlens",
                format!(
                    "has {} entries, batch is {}",
                    cache_seqlens.len(),
                    params.batch
                ),
            ));
        }
        let row = params.heads_kv * params.head_dim;
        let cache_len = match pages {
            Some((_, pg)) => {
                validate::check_pages(params, &pg)?;
                pg.pool_len(params)
            }
            None => params.kv_len(),
        };
        if cache.len() != cache_len {
            return Err(Error::invalid(
                "cache",
                format!("has {} elements, the shape needs {cache_len}", cache.len(),),
            ));
        }
        if new.len() % (params.batch * row) != 0 || new.is_empty() {
            return Err(Error::invalid(
                "new",
                format!(
                    "must hold batch · n · heads_kv · head_dim elements (n ≥ 1), got {}",
                    new.len()
                ),
            ));
        }
        let n = new.len() / (params.batch * row);
        for (b, &len) in cache_seqlens.iter().enumerate() {
            if len.checked_add(n).is_none_or(|end| end > params.seqlen_k) {
                return Err(Error::invalid(
                    "cache_seqlens",
                    format!(
                        "sequence {b}: {len} cached + {n} new rows exceed the capacity {}",
                        params.seqlen_k
                    ),
                ));
            }
        }
        // Destination of sequence b's cache row r, as an element offset; pages checked first.
        let counts: Vec<i32> = cache_seqlens.iter().map(|&l| (l + n) as i32).collect();
        if let Some((table, pg)) = pages {
            validate::check_kv_metadata(params, &counts, Some((table, &pg)), false)?;
        }
        let dest = |b: usize, r: usize| match pages {
            Some((table, pg)) => pg.pool_row(table, params.seqlen_k, b, r) * row,
            None => (b * params.seqlen_k + r) * row,
        };
        // Rows that stay contiguous in the cache (a sequence's, or a page's) go in one copy.
        for (b, &len) in cache_seqlens.iter().enumerate() {
            let mut i = 0;
            while i < n {
                let r = len + i;
                let count = match pages {
                    Some((_, pg)) => (n - i).min(pg.page_size - r % pg.page_size),
                    None => n - i,
                };
                let src = new.slice((b * n + i) * row..(b * n + i + count) * row);
                let start = dest(b, r);
                let mut dst = cache.slice_mut(start..start + count * row);
                self.stream().memcpy_dtod(&src, &mut dst)?;
                i += count;
            }
        }
        Ok(())
    }
}
