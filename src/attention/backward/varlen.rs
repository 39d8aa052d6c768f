//! The varlen backward: dQ, dK, dV of [`Context::attention_varlen`] over packed
//! sequences — Q, dQ, O, dO `[total_q, heads_q, head_dim]`, K, V, dK, dV `[total_k, heads_kv,
//! head_dim]`, `cu_seqlens_q` / `cu_seqlens_k` (i32 `[batch + 1]`, public metadata) and
//! optionally `seqused_k` (i32 `[batch]`), the forward's LSE fp32 `[heads_q, total_q]`.
//!
//! The dense backward's three kernels built with `FC_VARLEN` (kernels/fc_bwd_varlen.cuh): the
//! grids are the dense ones for `batch` sequences of `max_seqlen_q` / `max_seqlen_k`; each CTA
//! reads its sequence's offsets and lengths from `cu_seqlens` on the device (no host
//! synchronisation) and exits when its block lies past the sequence. Tensor maps span the packed
//! tensors (one batch): rows a tile reads past its sequence belong to the neighbour (or are
//! zero-filled past the pack) and add exactly zero — keys are masked by select, query rows get
//! LSE₂ = +∞ and D = 0 from the preprocess (the workspace is padded per sequence,
//! `batch · heads_q · pad(max_seqlen_q)` rows) — and stores are clipped to the sequence. So a
//! sequence's gradient bits depend on its own tokens and lengths only, never on its neighbours or
//! its place in the pack; a key past `seqused_k` gets dK = dV = 0. The one-pass kernels have no
//! varlen build.

use super::{
    check_backward_params, launch_with_block, padded_rows, workspace_layout, BackwardPlan,
    BwdKernelParams, InputStrides,
};
use crate::attention::call::{BackwardCall, Call, Grads, Keys};
use crate::attention::context::{Context, Element};
use crate::attention::external::{self, DeviceTensor, ExternalContext};
use crate::attention::launch::varlen::{check_cu_seqlens, check_meta_len, check_varlen_shapes};
use crate::attention::{tensor_map, validate};
use crate::error::{Error, Result};
use crate::kernels::backward as kb;
use crate::kernels::select;
use crate::spec::Strides;
use crate::spec::{AttentionParams, Layout};
use cudarc::driver::{sys, CudaSlice, DevicePtr, DevicePtrMut};

/// The rules of a varlen backward's shape (`params.batch` sequences, `params.seqlen_q` /
/// `seqlen_k` = `max_seqlen_q` / `max_seqlen_k`): the dense backward's, in the packed layout.
pub fn check_varlen_backward_params(p: &AttentionParams) -> Result<()> {
    if p.layout != Layout::Bshd {
        return Err(Error::invalid(
            "layout",
            "varlen tensors are packed [total tokens, heads, head_dim] (bshd)",
        ));
    }
    // The varlen builds (FC_VARLEN) exist at every backward head dim, with windows (aligned to
    // each sequence's own lengths) and softcap.
    check_backward_params(p)
}

/// Bytes of scratch one varlen backward needs: the dense two-pass workspace of `batch`
/// sequences of `max_seqlen_q` (LSE₂ and D per padded row).
pub fn varlen_workspace_bytes(p: &AttentionParams) -> usize {
    workspace_layout(
        p,
        crate::kernels::select::backward_varlen_call(p.dtype, p.head_dim, p.causal),
    )
    .3
}

/// A varlen call's pack: device addresses of its metadata (0: no `seqused_k`) and its totals.
#[derive(Debug, Clone, Copy)]
pub struct VarlenMeta {
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub seqused_k: u64,
    /// i32 `[batch]`, 0 for none: only sequence b's first `seqused_q[b]` queries count (the
    /// forward's); its other dQ rows are not written.
    pub seqused_q: u64,
    pub total_q: usize,
    pub total_k: usize,
}

/// Device addresses of one varlen backward's tensors: Q, K, V through the strides of
/// [`InputStrides`] (`batch` unused), the rest contiguous packed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VarlenPtrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// Learnable sinks fp32 `[heads_q]` and their gradient fp32 `[heads_q]` (summed over every
    /// sequence's rows); both 0 for none.
    pub sinks: u64,
    pub dsink: u64,
}

impl BackwardPlan {
    /// The kernels' parameter block of a varlen call (`dq_kernel`: the dQ kernel's box heights).
    fn varlen_block(
        &self,
        ptrs: &VarlenPtrs,
        input: InputStrides,
        meta: &VarlenMeta,
        workspace: u64,
        dq_kernel: bool,
    ) -> Result<BwdKernelParams> {
        let p = &self.params;
        let (tq, tk) = (meta.total_q, meta.total_k);
        let q_st = Strides::contiguous(Layout::Bshd, tq, p.heads_q, p.head_dim);
        let k_st = Strides::contiguous(Layout::Bshd, tk, p.heads_kv, p.head_dim);
        let t = self.variant.tiles();
        let (q_rows, k_rows) = if dq_kernel {
            (t.q_block_m, t.q_block_n)
        } else {
            (t.kv_block_m, t.kv_block_n)
        };
        // One packed batch; the sequence's first row is added to every coordinate.
        let map = |ptr, strides, total, heads, rows: usize| {
            tensor_map::encode(
                ptr,
                p.dtype,
                strides,
                1,
                total,
                heads,
                p.head_dim,
                rows as u32,
            )
        };
        let (hq, hkv) = (p.heads_q, p.heads_kv);
        let scale = p.softmax_scale();
        let (ws_dvec, _, _, _) = workspace_layout(p, self.variant);
        // Windows are aligned to each sequence's own lengths in the kernels; an unbounded side
        // is clamped by the longest ones (max_seqlen_q + max_seqlen_k bounds every sequence's).
        let (window_left, window_right, softcap_in, softcap_out) =
            crate::attention::launch::feature_fields(p, p.seqlen_q, p.seqlen_k);
        Ok(BwdKernelParams {
            q_map: map(ptrs.q, input.q, tq, hq, q_rows)?,
            k_map: map(ptrs.k, input.k, tk, hkv, k_rows)?,
            v_map: map(ptrs.v, input.v, tk, hkv, k_rows)?,
            do_map: map(ptrs.d_o, q_st, tq, hq, q_rows)?,
            o_ptr: ptrs.o,
            do_ptr: ptrs.d_o,
            lse_ptr: ptrs.lse,
            dq_ptr: ptrs.dq,
            dk_ptr: ptrs.dk,
            dv_ptr: ptrs.dv,
            lse2_ptr: workspace,
            dvec_ptr: workspace + ws_dvec as u64,
            // The grids' z is the sequence, not a batch stride.
            q_stride_b: 0,
            q_stride_s: q_st.seq,
            q_stride_h: q_st.head,
            k_stride_b: 0,
            k_stride_s: k_st.seq,
            k_stride_h: k_st.head,
            batch: p.batch as i32,
            seqlen_q: p.seqlen_q as i32,
            seqlen_k: p.seqlen_k as i32,
            heads_q: p.heads_q as i32,
            group: (p.heads_q / p.heads_kv) as i32,
            sq_pad: padded_rows(p.seqlen_q, self.variant) as i32,
            scale_log2: scale * std::f32::consts::LOG2_E,
            scale,
            kv_m_blocks: p.seqlen_q.div_ceil(t.kv_block_m) as i32,
            q_n_blocks: p.seqlen_k.div_ceil(t.q_block_n) as i32,
            dq_acc_ptr: 0,
            flags_ptr: 0,
            kv_n_blocks: p.seqlen_k.div_ceil(t.kv_block_n) as i32,
            vl_total_q: tq as i32,
            cu_q_ptr: meta.cu_seqlens_q,
            cu_k_ptr: meta.cu_seqlens_k,
            // Without seqused_k: cu_seqlens_k + 1, whose entry b bounds no sequence below its
            // own count (kernels/fc_bwd_varlen.cuh reads it unconditionally).
            used_k_ptr: if meta.seqused_k != 0 {
                meta.seqused_k
            } else {
                meta.cu_seqlens_k + 4
            },
            used_q_ptr: if meta.seqused_q != 0 {
                meta.seqused_q
            } else {
                meta.cu_seqlens_q + 4
            },
            vl_total_k: tk as i32,
            window_left,
            window_right,
            softcap_in,
            softcap_out,
            pad0: 0,
            sinks_ptr: ptrs.sinks,
            dsink_ptr: ptrs.dsink,
            reserved: [0; 2],
        })
    }

    /// Enqueues the varlen backward on `stream` (`workspace`: [`varlen_workspace_bytes`]). A pack
    /// with no query or no key token launches nothing: its gradients are zeroed here.
    ///
    /// # Safety
    /// Every pointer is a live device allocation of this plan's device holding what the packed
    /// shapes reach (Q, K, V as `input` strides say), the metadata `batch + 1` (`seqused_k`:
    /// `batch`) i32s, the workspace [`varlen_workspace_bytes`] bytes (16-byte aligned) used by
    /// no other launch in flight; all outlive the kernels; `stream` is a live stream of the
    /// primary context.
    pub(crate) unsafe fn launch_varlen_on(
        &self,
        ptrs: &VarlenPtrs,
        input: InputStrides,
        meta: &VarlenMeta,
        workspace: u64,
        stream: sys::CUstream,
    ) -> Result<()> {
        let p = &self.params;
        if !self.variant.varlen {
            return Err(Error::Other("not a varlen backward plan".into()));
        }
        let es = p.dtype.size();
        if meta.total_q == 0 || meta.total_k == 0 {
            // No query sees a key: every gradient is 0.
            for (ptr, rows, heads) in [
                (ptrs.dq, meta.total_q, p.heads_q),
                (ptrs.dk, meta.total_k, p.heads_kv),
                (ptrs.dv, meta.total_k, p.heads_kv),
            ] {
                let bytes = rows * heads * p.head_dim * es;
                if bytes > 0 {
                    cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream)?;
                }
            }
            // No row sees a key: O = 0, so D = 0 on every row and dsink = 0.
            if ptrs.dsink != 0 {
                cudarc::driver::result::memset_d8_async(ptrs.dsink, 0, p.heads_q * 4, stream)?;
            }
            return Ok(());
        }
        let mut kv_block = self.varlen_block(ptrs, input, meta, workspace, false)?;
        let mut q_block = self.varlen_block(ptrs, input, meta, workspace, true)?;
        let launch = |f: &cudarc::driver::CudaFunction,
                      grid: (u32, u32, u32),
                      threads: u32,
                      smem: usize,
                      block: &mut BwdKernelParams| {
            launch_with_block(f, grid, threads, smem, stream, block)
        };
        let (hq, hkv, b) = (p.heads_q as u32, p.heads_kv as u32, p.batch as u32);
        let t = self.variant.tiles();
        let rows = (padded_rows(p.seqlen_q, self.variant) / kb::PREPROCESS_ROWS) as u32;
        launch(
            &self.kernels.preprocess,
            (rows, hq, b),
            kb::PREPROCESS_THREADS,
            0,
            &mut kv_block,
        )?;
        // Learnable sinks: their gradient from the workspace, every sequence's rows in order
        // (padding rows add exp2(−inf)·0 = 0).
        if ptrs.sinks != 0 {
            launch(
                &self.kernels.dsink,
                (hq, 1, 1),
                kb::DSINK_THREADS,
                0,
                &mut kv_block,
            )?;
        }
        let grid = (p.seqlen_k.div_ceil(t.kv_block_n) as u32, hkv, b);
        let smem = self.variant.dkdv_smem_bytes();
        launch(
            &self.kernels.dkdv,
            grid,
            kb::GEMM_THREADS,
            smem,
            &mut kv_block,
        )?;
        let grid = (p.seqlen_q.div_ceil(t.q_block_m) as u32, hq, b);
        let smem = self.variant.dq_smem_bytes();
        launch(&self.kernels.dq, grid, kb::GEMM_THREADS, smem, &mut q_block)?;
        Ok(())
    }
}

impl Context {
    /// A varlen backward plan (the `FC_VARLEN` two-pass kernels loaded, the workspace allocated).
    fn plan_backward_varlen(&self, params: &AttentionParams) -> Result<BackwardPlan> {
        let mut plan = self.plan_backward_varlen_external(params)?;
        plan.workspace = Some(self.alloc::<f32>(varlen_workspace_bytes(params).div_ceil(4))?);
        Ok(plan)
    }

    pub(crate) fn plan_backward_varlen_external(
        &self,
        params: &AttentionParams,
    ) -> Result<BackwardPlan> {
        check_varlen_backward_params(params)?;
        let variant = select::backward_varlen(params, crate::knobs::bwd_onepass())?;
        Ok(BackwardPlan {
            params: params.clone(),
            variant,
            kernels: super::loaded(self.cuda(), variant)?,
            workspace: None,
            stream: self.stream().clone(),
        })
    }

    /// dQ, dK, dV of [`Context::attention_varlen`] (same `params`: `batch` sequences,
    /// `seqlen_q` / `seqlen_k` = `max_seqlen_q` / `max_seqlen_k`, layout `Bshd`) from the packed
    /// q, k, v, the forward's `o` and `lse` (fp32 `[heads_q, total_q]`) and `d_o` (q's shape).
    /// `dq` is packed like q, `dk`, `dv` like k (GQA: summed over each K/V head's query heads).
    /// `seqused` = (`seqused_k`, `seqused_q`), i32 `[batch]` each, as the forward's: sequence b's
    /// queries saw its first `seqused_k[b]` keys only (its other keys up to `max_seqlen_k` get
    /// dK = dV = 0; past it they are not written), and only its first `seqused_q[b]` queries
    /// count (its other rows of `dq` are not written, as the forward leaves those rows of `o`).
    /// Bitwise deterministic; a
    /// sequence's bits do not depend on the others in the pack nor on its place there.
    ///
    /// Downloads `cu_seqlens` once to check them (a host synchronisation; the forward's rules),
    /// and checks every buffer's length before any launch.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_backward<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens_q: &CudaSlice<i32>,
        cu_seqlens_k: &CudaSlice<i32>,
        seqused: [Option<&CudaSlice<i32>>; 2],
        o: &CudaSlice<T>,
        lse: &CudaSlice<f32>,
        d_o: &CudaSlice<T>,
        dq: &mut CudaSlice<T>,
        dk: &mut CudaSlice<T>,
        dv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let keys = varlen_keys(k, v, [cu_seqlens_q, cu_seqlens_k], seqused);
        let call = BackwardCall::new(Call::new(params, q, keys), o, Some(lse), d_o);
        self.run_backward(&call, Grads::new(dq, dk, dv))
    }

    /// As [`Context::attention_varlen_backward`] for a varlen forward with learnable sinks
    /// ([`Context::attention_varlen_device_with_sinks`], fp32 `[heads_q]`), also writing their
    /// gradient into `dsink` (fp32 `[heads_q]`): summed over every sequence's rows in a fixed
    /// order (bitwise deterministic; it depends on the whole pack, as a sum over it must).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_backward_with_sinks<T: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        cu_seqlens_q: &CudaSlice<i32>,
        cu_seqlens_k: &CudaSlice<i32>,
        seqused: [Option<&CudaSlice<i32>>; 2],
        o: &CudaSlice<T>,
        lse: &CudaSlice<f32>,
        d_o: &CudaSlice<T>,
        sinks: &CudaSlice<f32>,
        dq: &mut CudaSlice<T>,
        dk: &mut CudaSlice<T>,
        dv: &mut CudaSlice<T>,
        dsink: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let keys = varlen_keys(k, v, [cu_seqlens_q, cu_seqlens_k], seqused);
        let call = BackwardCall::new(Call::new(params, q, keys).sinks(sinks), o, Some(lse), d_o);
        self.run_backward(&call, Grads::new(dq, dk, dv).dsink(dsink))
    }

    /// The varlen backward ([`Context::run_backward`] with [`Keys::Varlen`]): every rule checked
    /// (the offsets downloaded once), then the plan's launches. `sinks` and `dsink` come together
    /// or not at all.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn varlen_backward_checked<T: Element, U: Element>(
        &self,
        params: &AttentionParams,
        [q, k, v]: [&CudaSlice<T>; 3],
        [cu_seqlens_q, cu_seqlens_k]: [&CudaSlice<i32>; 2],
        [seqused_k, seqused_q]: [Option<&CudaSlice<i32>>; 2],
        o: &CudaSlice<T>,
        d_o: &CudaSlice<U>,
        lse: &CudaSlice<f32>,
        sinks: Option<&CudaSlice<f32>>,
        dsink: Option<&mut CudaSlice<f32>>,
        [dq, dk, dv]: [&mut CudaSlice<T>; 3],
    ) -> Result<()> {
        validate::check_buffers_dtype(params, T::DTYPE)?;
        if U::DTYPE != params.dtype {
            // Reached only through `run_backward` with a `d_o` of another element type.
            return Err(Error::invalid(
                "d_o",
                format!(
                    "holds {} but the call's dtype is {}",
                    U::DTYPE.name(),
                    params.dtype.name()
                ),
            ));
        }
        check_varlen_backward_params(params)?;
        let (total_q, total_k) = check_varlen_shapes(
            params,
            q.len(),
            [k.len(), v.len()],
            o.len(),
            Some(lse.len()),
        )
        .map_err(|e| match e {
            Error::InvalidArgument { arg: "out", rule } => {
                Error::InvalidArgument { arg: "o", rule }
            }
            other => other,
        })?;
        for (name, len, want) in [
            ("d_o", d_o.len(), q.len()),
            ("dq", dq.len(), q.len()),
            ("dk", dk.len(), k.len()),
            ("dv", dv.len(), k.len()),
        ] {
            if len != want {
                return Err(Error::invalid(
                    name,
                    format!("has {len} elements, the packed shape needs {want}"),
                ));
            }
        }
        check_meta_len("cu_seqlens_q", cu_seqlens_q.len(), params.batch + 1)?;
        check_meta_len("cu_seqlens_k", cu_seqlens_k.len(), params.batch + 1)?;
        for (name, u) in [("seqused_k", seqused_k), ("seqused_q", seqused_q)] {
            if let Some(u) = u {
                check_meta_len(name, u.len(), params.batch)?;
            }
        }
        let cu_q = self.download(cu_seqlens_q)?;
        let cu_k = self.download(cu_seqlens_k)?;
        check_cu_seqlens(
            "cu_seqlens_q",
            &cu_q,
            params.batch,
            total_q,
            params.seqlen_q,
        )?;
        check_cu_seqlens(
            "cu_seqlens_k",
            &cu_k,
            params.batch,
            total_k,
            params.seqlen_k,
        )?;
        let plan = self.plan_backward_varlen(params)?;
        let s = self.stream();
        let (q_ptr, _g1) = q.device_ptr(s);
        let (k_ptr, _g2) = k.device_ptr(s);
        let (v_ptr, _g3) = v.device_ptr(s);
        let (o_ptr, _g4) = o.device_ptr(s);
        let (lse_ptr, _g5) = lse.device_ptr(s);
        let (do_ptr, _g6) = d_o.device_ptr(s);
        let (cuq_ptr, _g7) = cu_seqlens_q.device_ptr(s);
        let (cuk_ptr, _g8) = cu_seqlens_k.device_ptr(s);
        let used = seqused_k.map(|u| u.device_ptr(s));
        let used_q = seqused_q.map(|u| u.device_ptr(s));
        let (dq_ptr, _g9) = dq.device_ptr_mut(s);
        let (dk_ptr, _g10) = dk.device_ptr_mut(s);
        let (dv_ptr, _g11) = dv.device_ptr_mut(s);
        let sinks = sinks.map(|sk| (sk.len(), sk.device_ptr(s)));
        let sinks_info = sinks.as_ref().map(|(len, (ptr, _))| (*len, *ptr));
        let dsink = dsink.map(|ds| (ds.len(), ds.device_ptr_mut(s)));
        let dsink_info = dsink.as_ref().map(|(len, (ptr, _))| (*len, *ptr));
        super::check_backward_sinks(params, sinks_info, dsink_info)?;
        let ptrs = VarlenPtrs {
            q: q_ptr,
            k: k_ptr,
            v: v_ptr,
            o: o_ptr,
            lse: lse_ptr,
            d_o: do_ptr,
            dq: dq_ptr,
            dk: dk_ptr,
            dv: dv_ptr,
            sinks: sinks_info.map_or(0, |x| x.1),
            dsink: dsink_info.map_or(0, |x| x.1),
        };
        let meta = VarlenMeta {
            cu_seqlens_q: cuq_ptr,
            cu_seqlens_k: cuk_ptr,
            seqused_k: used.as_ref().map_or(0, |u| u.0),
            seqused_q: used_q.as_ref().map_or(0, |u| u.0),
            total_q,
            total_k,
        };
        let q_st = Strides::contiguous(Layout::Bshd, total_q, params.heads_q, params.head_dim);
        let k_st = Strides::contiguous(Layout::Bshd, total_k, params.heads_kv, params.head_dim);
        let input = InputStrides {
            q: q_st,
            k: k_st,
            v: k_st,
        };
        let ws = plan
            .workspace
            .as_ref()
            .ok_or_else(|| Error::Other("varlen backward plan without workspace".into()))?
            .device_ptr(s)
            .0;
        // SAFETY: every buffer's dtype and length was checked against the packed shape, the
        // metadata's values against the pack.
        unsafe { plan.launch_varlen_on(&ptrs, input, &meta, ws, s.cu_stream()) }
    }
}

/// The forward's keys of a varlen call with device offsets, as the varlen backward methods take
/// them.
fn varlen_keys<'a, T>(
    k: &'a CudaSlice<T>,
    v: &'a CudaSlice<T>,
    [cu_seqlens_q, cu_seqlens_k]: [&'a CudaSlice<i32>; 2],
    [seqused_k, seqused_q]: [Option<&'a CudaSlice<i32>>; 2],
) -> Keys<'a, T> {
    Keys::Varlen {
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        seqused_q,
    }
}

/// One varlen backward on caller-owned memory (the PyTorch autograd's entry point): no host
/// synchronisation — the `cu_seqlens` values are never read on the host (the kernels clamp them
/// into the pack, as the forward's device-built work list does). `params` as for
/// [`Context::attention_varlen_backward`] (`layout` not used); Q, K, V may be strided (their
/// `batch` stride is not used); O, dO, dQ, dK, dV are contiguous packed; `lse` fp32
/// `[heads_q, total_q]`.
#[derive(Debug, Clone)]
pub struct ExternalVarlenBackwardCall {
    pub params: AttentionParams,
    pub total_q: usize,
    pub total_k: usize,
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// i32 `[batch + 1]` each; `seqused_k` i32 `[batch]` or 0 for none.
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub seqused_k: u64,
    /// i32 `[batch]` or 0: only sequence b's first `seqused_q[b]` queries count; dQ rows of no
    /// sequence's used queries are not written (the caller zeroes them).
    pub seqused_q: u64,
    /// [`varlen_workspace_bytes`] bytes, 16-byte aligned, used by no other launch in flight.
    pub workspace: u64,
    /// Learnable sinks: the forward's fp32 `[heads_q]` logits and their gradient fp32
    /// `[heads_q]` (written); both 0 for a call without sinks.
    pub sinks: u64,
    pub dsink: u64,
}

/// Every rule of an [`ExternalVarlenBackwardCall`] that the host can check with no GPU.
pub fn validate_varlen_backward(call: &ExternalVarlenBackwardCall) -> Result<()> {
    let p = AttentionParams {
        layout: Layout::Bshd,
        ..call.params.clone()
    };
    check_varlen_backward_params(&p)?;
    let (row_q, row_k) = (p.heads_q * p.head_dim, p.heads_kv * p.head_dim);
    check_varlen_shapes(
        &p,
        call.total_q * row_q,
        [call.total_k * row_k; 2],
        call.total_q * row_q,
        Some(p.heads_q * call.total_q),
    )?;
    if call.total_q > i32::MAX as usize || call.total_k > i32::MAX as usize {
        return Err(Error::invalid("q", "more than 2^31 - 1 packed tokens"));
    }
    let nonnull = |arg: &'static str, ptr: u64, align: u64| -> Result<()> {
        if ptr == 0 {
            return Err(Error::invalid(arg, "null device pointer"));
        }
        if ptr % align != 0 {
            return Err(Error::invalid(
                arg,
                format!("device address {ptr:#x} is not {align}-byte aligned"),
            ));
        }
        Ok(())
    };
    let a = validate::TENSOR_ALIGN as u64;
    nonnull("cu_seqlens_q", call.cu_seqlens_q, 4)?;
    nonnull("cu_seqlens_k", call.cu_seqlens_k, 4)?;
    for (arg, ptr) in [("seqused_k", call.seqused_k), ("seqused_q", call.seqused_q)] {
        if ptr % 4 != 0 {
            return Err(Error::invalid(arg, "device address is not 4-byte aligned"));
        }
    }
    nonnull("workspace", call.workspace, a)?;
    if call.total_q > 0 {
        let q_ext = [1, call.total_q, p.heads_q];
        let es = p.dtype.size() as i64;
        external::check_tensor("q", &call.q, q_ext, es)?;
        for (arg, ptr) in [("o", call.o), ("d_o", call.d_o), ("dq", call.dq)] {
            nonnull(arg, ptr, a)?;
        }
        nonnull("lse", call.lse, 4)?;
    }
    if call.total_k > 0 {
        let kv_ext = [1, call.total_k, p.heads_kv];
        let es = p.dtype.size() as i64;
        external::check_tensor("k", &call.k, kv_ext, es)?;
        external::check_tensor("v", &call.v, kv_ext, es)?;
        nonnull("dk", call.dk, a)?;
        nonnull("dv", call.dv, a)?;
    }
    match (call.sinks, call.dsink) {
        (0, 0) => {}
        (s, d) => {
            let len = p.heads_q;
            super::check_backward_sinks(
                &p,
                (s != 0).then_some((len, s)),
                (d != 0).then_some((len, d)),
            )?;
        }
    }
    Ok(())
}

impl ExternalContext {
    /// Enqueues the varlen backward of `call` on `stream` (three kernels; none when the pack has
    /// no query or no key: the gradients are zeroed). No host synchronisation. Bitwise
    /// deterministic, each sequence's bits independent of its neighbours.
    ///
    /// # Safety
    /// Every pointer is a live device allocation of this device holding what the packed shapes
    /// reach; the metadata holds `batch + 1` (`seqused_k`: `batch`) i32s; no output overlaps
    /// another buffer; all outlive the kernels; `stream` is a live stream of this device's
    /// primary context.
    pub unsafe fn attention_varlen_backward(
        &self,
        call: &ExternalVarlenBackwardCall,
        stream: sys::CUstream,
    ) -> Result<()> {
        validate_varlen_backward(call)?;
        let cuda = self.context().cuda();
        cuda.check_err()?;
        let before = cudarc::driver::result::ctx::get_current()?;
        if before != Some(cuda.cu_ctx()) {
            // SAFETY: the context is this device's primary context, retained by `self`.
            unsafe { cudarc::driver::result::ctx::set_current(cuda.cu_ctx()) }?;
        }
        let params = AttentionParams {
            layout: Layout::Bshd,
            ..call.params.clone()
        };
        let result = (|| {
            let plan = self.context().plan_backward_varlen_external(&params)?;
            let ptrs = VarlenPtrs {
                q: call.q.ptr,
                k: call.k.ptr,
                v: call.v.ptr,
                o: call.o,
                lse: call.lse,
                d_o: call.d_o,
                dq: call.dq,
                dk: call.dk,
                dv: call.dv,
                sinks: call.sinks,
                dsink: call.dsink,
            };
            let meta = VarlenMeta {
                cu_seqlens_q: call.cu_seqlens_q,
                cu_seqlens_k: call.cu_seqlens_k,
                seqused_k: call.seqused_k,
                seqused_q: call.seqused_q,
                total_q: call.total_q,
                total_k: call.total_k,
            };
            let fix = |s: Strides, hd: usize| Strides {
                batch: hd as i64,
                ..s
            };
            let input = InputStrides {
                q: fix(call.q.strides, params.head_dim),
                k: fix(call.k.strides, params.head_dim),
                v: fix(call.v.strides, params.head_dim),
            };
            // SAFETY: validated above; liveness and sizes are the caller's contract.
            unsafe { plan.launch_varlen_on(&ptrs, input, &meta, call.workspace, stream) }
        })();
        if before != Some(cuda.cu_ctx()) {
            let ctx = before.unwrap_or(std::ptr::null_mut());
            // SAFETY: `ctx` was current on this thread before, so it is live (null unbinds).
            let _ = unsafe { cudarc::driver::result::ctx::set_current(ctx) };
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::arg_of;

    fn call() -> ExternalVarlenBackwardCall {
        let p = AttentionParams::new(3, 4, 129, 64).seqlen_k(200);
        let p = AttentionParams { heads_kv: 2, ..p };
        let t = |ptr, heads: usize| DeviceTensor {
            ptr,
            strides: Strides::contiguous(Layout::Bshd, 300, heads, 64),
        };
        ExternalVarlenBackwardCall {
            params: p,
            total_q: 300,
            total_k: 400,
            q: t(0x10000, 4),
            k: t(0x20000, 2),
            v: t(0x30000, 2),
            o: 0x40000,
            lse: 0x50000,
            d_o: 0x60000,
            dq: 0x70000,
            dk: 0x80000,
            dv: 0x90000,
            cu_seqlens_q: 0xa0000,
            cu_seqlens_k: 0xa1000,
            seqused_k: 0,
            seqused_q: 0,
            workspace: 0xb0000,
            sinks: 0,
            dsink: 0,
        }
    }

    #[test]
    fn a_well_formed_varlen_call_passes() {
        validate_varlen_backward(&call()).unwrap();
    }

    #[test]
    fn every_head_dim_and_feature_has_a_varlen_backward_build() {
        let p = call().params;
        check_varlen_backward_params(&p).unwrap();
        let w = crate::spec::Window::from_flash_attn(16, 0);
        for q in [p.clone().window(w), p.clone().softcap(30.0)] {
            check_varlen_backward_params(&q).unwrap();
            let v = select::backward_varlen(&q, None).unwrap();
            assert!(v.varlen && v.window && !v.onepass, "{v:?}");
            assert_eq!(v.softcap, q.softcap != 0.0);
        }
        for d in crate::spec::SUPPORTED_HEAD_DIMS {
            let q = AttentionParams {
                head_dim: d,
                ..p.clone()
            };
            check_varlen_backward_params(&q).unwrap();
        }
        // A head dim with no backward at all is still refused.
        let q = AttentionParams {
            head_dim: 80,
            ..p.clone()
        };
        assert_eq!(arg_of(check_varlen_backward_params(&q)), "head_dim");
    }

    #[test]
    fn null_or_misaligned_varlen_buffers_are_rejected() {
        for (which, name) in [
            (0, "cu_seqlens_q"),
            (1, "cu_seqlens_k"),
            (2, "o"),
            (3, "d_o"),
            (4, "dq"),
            (5, "dk"),
            (6, "dv"),
            (7, "workspace"),
            (8, "lse"),
        ] {
            for bad in [0u64, 0x1002] {
                let mut c = call();
                let f = match which {
                    0 => &mut c.cu_seqlens_q,
                    1 => &mut c.cu_seqlens_k,
                    2 => &mut c.o,
                    3 => &mut c.d_o,
                    4 => &mut c.dq,
                    5 => &mut c.dk,
                    6 => &mut c.dv,
                    7 => &mut c.workspace,
                    _ => &mut c.lse,
                };
                *f = bad;
                assert_eq!(
                    arg_of(validate_varlen_backward(&c)),
                    name,
                    "{name} {bad:#x}"
                );
            }
        }
        let mut c = call();
        c.seqused_k = 0x1002;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "seqused_k");
        let mut c = call();
        c.seqused_q = 0x1002;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "seqused_q");
    }

    #[test]
    fn the_backward_feature_and_shape_rules_apply_to_varlen() {
        let mut c = call();
        c.params.softcap = -1.0;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "softcap");
        // Sinks come with their gradient, both 4-byte aligned.
        let mut c = call();
        c.sinks = 0xc0000;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "dsink");
        c.dsink = 0xc1000;
        validate_varlen_backward(&c).unwrap();
        c.sinks = 0;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "sinks");
        c.sinks = 0xc0002;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "sinks");
        let mut c = call();
        c.params.heads_kv = 3;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "heads_kv");
        let mut c = call();
        c.q.strides.seq = 65;
        assert_eq!(arg_of(validate_varlen_backward(&c)), "q");
        let mut p = call().params;
        p.layout = Layout::Bhsd;
        assert_eq!(arg_of(check_varlen_backward_params(&p)), "layout");
    }

    #[test]
    fn the_one_pass_backward_is_refused_for_varlen() {
        let p = call().params;
        let e = select::backward_varlen(&p, Some(true)).unwrap_err();
        assert!(e.to_string().contains("no varlen build"), "{e}");
        assert_eq!(arg_of(Err(e)), "FLASHCORE_BWD_ONEPASS");
        for ok in [None, Some(false)] {
            let v = select::backward_varlen(&p, ok).unwrap();
            assert!(v.varlen && !v.onepass, "{v:?}");
        }
    }

    #[test]
    fn varlen_workspace_is_padded_per_sequence() {
        let p = call().params; // 3 sequences, 4 query heads, max_seqlen_q 129 → 256 rows each
        assert_eq!(varlen_workspace_bytes(&p), 2 * 3 * 4 * 256 * 4);
    }
}
