//! The backward pass: dQ, dK, dV of `O = softmax(scale · Q Kᵀ + mask) V` from Q, K, V,
//! the forward's O and LSE, and dO. Three launches on the context's stream
//! (`kernels/attention_bwd.cu`): a preprocess into a padded fp32 workspace, the dK/dV kernel and
//! the dQ kernel. Every gradient element is summed by one CTA in an order fixed by the shape: the
//! result is bitwise deterministic and a sequence's bits do not depend on its batch. At d128
//! causal the default is the one-pass kernel instead
//! ([`crate::kernels::select::default_onepass`]): dQ's partials are added across CTAs in a
//! turn order fixed by the shape, so the same holds. Windows and softcap run their own two-pass
//! builds ([`crate::kernels::select::backward`]); a call with
//! learnable sinks adds a fourth launch, the sinks' gradient (`flashcore_bwd_dsink`).
//!
//! Every rule is checked on the host before anything is launched ([`check_backward`]).

use super::call::{BackwardCall, Call, Grads, Keys};
use super::context::{Context, Element};
use super::{tensor_map, validate};
use crate::abi::BwdKernelParams;
pub use crate::abi::{FLAGS_FIELD, VARLEN_FIELDS};
use crate::error::{Error, Result};
use crate::kernels::backward::{self as kb, BwdVariant};
use crate::spec::Strides;
use crate::spec::{AttentionParams, DType};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub mod varlen;

/// Grid dimensions y and z (heads, batch) are at most 65535.
const MAX_GRID_YZ: usize = 65_535;

/// The shape rules of the backward: the forward's, plus the launch grid's limits.
pub fn check_backward_params(p: &AttentionParams) -> Result<()> {
    validate::check_params(p)?;
    validate::check_backward_head_dim(p)?;
    if p.batch > MAX_GRID_YZ {
        return Err(Error::invalid(
            "batch",
            format!(
                "the backward launches one grid row per sequence: at most {MAX_GRID_YZ}, got {}",
                p.batch
            ),
        ));
    }
    if p.heads_q > MAX_GRID_YZ {
        return Err(Error::invalid(
            "heads_q",
            format!(
                "the backward launches one grid row per head: at most {MAX_GRID_YZ}, got {}",
                p.heads_q
            ),
        ));
    }
    // The padded workspace's row count must fit the kernels' i32 row indices.
    if p.seqlen_q.div_ceil(kb::ROW_PAD_80) * kb::ROW_PAD_80 >= i32::MAX as usize {
        return Err(Error::invalid(
            "seqlen_q",
            "too long for the backward's workspace indices",
        ));
    }
    Ok(())
}

/// The variant a call selected must be built for it: the opt-in one-pass kernels
/// (`FLASHCORE_BWD_ONEPASS=1`) serve only [`kb::ONEPASS_HEAD_DIMS`] and have no window or softcap
/// (the two-pass window/softcap builds exist at every backward head dim).
pub fn check_backward_variant(v: BwdVariant) -> Result<()> {
    if v.onepass && !kb::ONEPASS_HEAD_DIMS.contains(&v.head_dim) {
        return Err(Error::invalid(
            "head_dim",
            format!(
                "the one-pass backward (FLASHCORE_BWD_ONEPASS=1) serves head dims 64 and 128, got {}; \
                 unset it for the two-pass kernels",
                v.head_dim
            ),
        ));
    }
    if v.onepass && (v.window || v.softcap) {
        let arg = if v.softcap { "softcap" } else { "window" };
        return Err(Error::invalid(
            arg,
            "the one-pass backward (FLASHCORE_BWD_ONEPASS=1) does not support sliding windows or \
             softcap: unset FLASHCORE_BWD_ONEPASS to run the two-pass kernels",
        ));
    }
    Ok(())
}

/// Learnable sinks of a backward call: `sinks` fp32 `[heads_q]` (the forward's) and
/// `dsink` fp32 `[heads_q]` (their gradient, written), each as (length, address), both given or
/// neither.
pub fn check_backward_sinks(
    p: &AttentionParams,
    sinks: Option<(usize, u64)>,
    dsink: Option<(usize, u64)>,
) -> Result<()> {
    match (sinks, dsink) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(Error::invalid(
            "dsink",
            "a call with sinks needs a dsink buffer (f32 [heads_q]) for their gradient",
        )),
        (None, Some(_)) => Err(Error::invalid(
            "sinks",
            "a dsink buffer was given without the sinks (f32 [heads_q]) the forward used",
        )),
        (Some((sl, sa)), Some((dl, da))) => {
            validate::check_buffer("sinks", sl, p.heads_q, sa, 4)?;
            validate::check_buffer("dsink", dl, p.heads_q, da, 4)
        }
    }
}

/// Launches one backward kernel with the parameter block as its only argument (the dense and
/// varlen plans share it).
///
/// # Safety
/// The block's device addresses must be live for the kernel, as the callers' own contracts say.
unsafe fn launch_with_block(
    f: &cudarc::driver::CudaFunction,
    grid: (u32, u32, u32),
    threads: u32,
    smem: usize,
    stream: sys::CUstream,
    block: &mut BwdKernelParams,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    let mut args: [*mut std::ffi::c_void; 1] =
        [block as *mut BwdKernelParams as *mut std::ffi::c_void];
    cudarc::driver::result::launch_kernel(
        f.cu_function(),
        grid,
        (threads, 1, 1),
        smem as u32,
        stream,
        &mut args,
    )
}

/// Sq rounded up to the variant's padding ([`BwdVariant::row_pad`]), host and kernels alike.
pub(crate) fn padded_rows(seqlen_q: usize, v: BwdVariant) -> usize {
    seqlen_q.div_ceil(v.row_pad()) * v.row_pad()
}

/// What one backward call brings, as the host sees it: each buffer's element type, length and
/// device address (`None`: not given). Checked by [`check_backward`] without touching the GPU.
#[derive(Debug, Clone, Copy)]
pub struct BackwardBuffers {
    pub q: (DType, usize, u64),
    pub k: (DType, usize, u64),
    pub v: (DType, usize, u64),
    pub o: (DType, usize, u64),
    pub d_o: (DType, usize, u64),
    /// The forward's log-sum-exp, f32 `[batch, heads_q, seqlen_q]`.
    pub lse: Option<(usize, u64)>,
    pub dq: (DType, usize, u64),
    pub dk: (DType, usize, u64),
    pub dv: (DType, usize, u64),
}

/// Every rule of one backward call, before any launch: the shape, each buffer's dtype, length and
/// alignment (16 bytes where TMA or vector loads read it), and the LSE's presence.
pub fn check_backward(p: &AttentionParams, b: &BackwardBuffers) -> Result<()> {
    check_backward_params(p)?;
    let align = validate::TENSOR_ALIGN;
    // (name, (dtype, length, address) given, length wanted, alignment)
    type Rule = (&'static str, (DType, usize, u64), usize, usize);
    let tensors: [Rule; 8] = [
        ("q", b.q, p.q_len(), align),
        ("k", b.k, p.kv_len(), align),
        ("v", b.v, p.kv_len(), align),
        ("o", b.o, p.q_len(), align),
        ("d_o", b.d_o, p.q_len(), align),
        ("dq", b.dq, p.q_len(), 4),
        ("dk", b.dk, p.kv_len(), 4),
        ("dv", b.dv, p.kv_len(), 4),
    ];
    for (name, (dtype, len, addr), want, al) in tensors {
        if dtype != p.dtype {
            return Err(Error::invalid(
                name,
                format!(
                    "holds {} but the call's dtype is {}",
                    dtype.name(),
                    p.dtype.name()
                ),
            ));
        }
        validate::check_buffer(name, len, want, addr, al)?;
    }
    match b.lse {
        None => Err(Error::invalid(
            "lse",
            "the backward needs the forward's log-sum-exp (f32 [batch, heads_q, seqlen_q]): pass the `lse` the forward wrote",
        )),
        Some((len, addr)) => validate::check_buffer("lse", len, p.lse_len(), addr, 4),
    }
}

/// One variant's three kernels loaded on a device's primary context (the one both [`Context`]
/// and `ExternalContext` use), shared by every plan of the process. Holding the context keeps the
/// module valid for as long as the cache lives (the process).
struct LoadedBackward {
    _cuda: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    preprocess: CudaFunction,
    dkdv: CudaFunction,
    dq: CudaFunction,
    dsink: CudaFunction,
}

/// The loaded kernels of `variant` on `cuda`'s device, loading them on first use.
fn loaded(cuda: &Arc<CudaContext>, variant: BwdVariant) -> Result<Arc<LoadedBackward>> {
    type Cache = Mutex<HashMap<(usize, BwdVariant), Arc<LoadedBackward>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Other("backward kernel cache lock poisoned".into()))?;
    let key = (cuda.ordinal(), variant);
    if let Some(k) = cache.get(&key) {
        return Ok(k.clone());
    }
    let module = cuda.load_module(cudarc::nvrtc::Ptx::from_binary(variant.cubin()?))?;
    let [pre_sym, main_sym, last_sym] = variant.symbols();
    let preprocess = module.load_function(pre_sym)?;
    // Two passes: the dK/dV and dQ kernels; one pass: the one-pass kernel and dQ's conversion.
    let dkdv = module.load_function(main_sym)?;
    let dq = module.load_function(last_sym)?;
    let dsink = module.load_function(kb::DSINK_SYMBOL)?;
    let attr = sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    if variant.onepass {
        dkdv.set_attribute(attr, variant.onepass_smem_bytes() as i32)?;
    } else {
        dkdv.set_attribute(attr, variant.dkdv_smem_bytes() as i32)?;
        dq.set_attribute(attr, variant.dq_smem_bytes() as i32)?;
    }
    let k = Arc::new(LoadedBackward {
        _cuda: cuda.clone(),
        _module: module,
        preprocess,
        dkdv,
        dq,
        dsink,
    });
    cache.insert(key, k.clone());
    Ok(k)
}

/// Bytes of scratch one backward call needs: the LSE in base 2 and D = rowsum(dO ∘ O), fp32,
/// `batch · heads_q · padded Sq` each (Sq padded to the variant's row padding, 128 or 640:
/// [`BwdVariant::row_pad`]); for the one-pass
/// variant the call runs ([`crate::kernels::select::backward`]), also dQ's fp32 accumulator (`head_dim`
/// floats per padded row) and an int32 turn counter per (sequence, head, query tile).
pub fn workspace_bytes(p: &AttentionParams) -> usize {
    workspace_layout(p, crate::kernels::select::backward(p)).3
}

/// Byte offsets of the workspace's parts (D, dQ accumulator, counters) and its size.
fn workspace_layout(p: &AttentionParams, v: BwdVariant) -> (usize, usize, usize, usize) {
    let rows = p.batch * p.heads_q * padded_rows(p.seqlen_q, v);
    let dvec = rows * 4;
    let two = 2 * rows * 4;
    if !v.onepass {
        return (dvec, two, two, two);
    }
    let acc = two;
    let flags = acc + rows * p.head_dim * 4;
    let tiles = p.seqlen_q.div_ceil(v.tiles().kv_block_m);
    let end = flags + (p.batch * p.heads_q * tiles * 4).div_ceil(16) * 16;
    (dvec, acc, flags, end)
}

/// A backward pass prepared for one shape: the variant's three kernels loaded, the grids, and —
/// for [`Context`] calls — the workspace ([`workspace_bytes`]).
pub struct BackwardPlan {
    params: AttentionParams,
    variant: BwdVariant,
    kernels: Arc<LoadedBackward>,
    workspace: Option<CudaSlice<f32>>,
    stream: Arc<CudaStream>,
}

/// Element strides of Q, K and V as the kernels' tensor maps read them (the other tensors are
/// contiguous in the call's layout).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputStrides {
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
}

/// Device addresses of one backward call's buffers (contiguous in the plan's layout).
#[derive(Debug, Clone, Copy)]
pub struct BackwardPtrs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub o: u64,
    pub lse: u64,
    pub d_o: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
    /// Learnable sinks: fp32 `[heads_q]` logits the forward used, and their gradient
    /// fp32 `[heads_q]` (written); both 0 for a call without sinks.
    pub sinks: u64,
    pub dsink: u64,
}

impl BackwardPlan {
    pub fn params(&self) -> &AttentionParams {
        &self.params
    }

    pub fn variant(&self) -> BwdVariant {
        self.variant
    }

    /// Q, K and V contiguous in the plan's layout.
    fn contiguous_inputs(&self) -> InputStrides {
        let p = &self.params;
        let k = Strides::contiguous(p.layout, p.seqlen_k, p.heads_kv, p.head_dim);
        InputStrides {
            q: Strides::contiguous(p.layout, p.seqlen_q, p.heads_q, p.head_dim),
            k,
            v: k,
        }
    }

    /// The parameter block of the dQ kernel (`dq_kernel`) or of the other two. O, dO, dQ, dK and
    /// dV are contiguous in the plan's layout; Q, K and V are read through tensor maps with the
    /// strides `input` gives.
    fn block(
        &self,
        ptrs: &BackwardPtrs,
        input: InputStrides,
        workspace: u64,
        dq_kernel: bool,
    ) -> Result<BwdKernelParams> {
        let p = &self.params;
        let q_st = Strides::contiguous(p.layout, p.seqlen_q, p.heads_q, p.head_dim);
        let k_st = Strides::contiguous(p.layout, p.seqlen_k, p.heads_kv, p.head_dim);
        // Box heights: each kernel's held and streamed tiles (BwdVariant::tiles).
        let t = self.variant.tiles();
        let (q_rows, k_rows) = if dq_kernel {
            (t.q_block_m, t.q_block_n)
        } else {
            (t.kv_block_m, t.kv_block_n)
        };
        let map = |ptr, strides, seqlen, heads, rows: usize| {
            tensor_map::encode(
                ptr,
                p.dtype,
                strides,
                p.batch,
                seqlen,
                heads,
                p.head_dim,
                rows as u32,
            )
        };
        let (sq, sk, hq, hkv) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv);
        let scale = p.softmax_scale();
        let (ws_dvec, ws_acc, ws_flags, _) = workspace_layout(p, self.variant);
        let (window_left, window_right, softcap_in, softcap_out) =
            super::launch::feature_fields(p, p.seqlen_q, p.seqlen_k);
        Ok(BwdKernelParams {
            q_map: map(ptrs.q, input.q, sq, hq, q_rows)?,
            k_map: map(ptrs.k, input.k, sk, hkv, k_rows)?,
            v_map: map(ptrs.v, input.v, sk, hkv, k_rows)?,
            do_map: map(ptrs.d_o, q_st, sq, hq, q_rows)?,
            o_ptr: ptrs.o,
            do_ptr: ptrs.d_o,
            lse_ptr: ptrs.lse,
            dq_ptr: ptrs.dq,
            dk_ptr: ptrs.dk,
            dv_ptr: ptrs.dv,
            lse2_ptr: workspace,
            dvec_ptr: workspace + ws_dvec as u64,
            q_stride_b: q_st.batch,
            q_stride_s: q_st.seq,
            q_stride_h: q_st.head,
            k_stride_b: k_st.batch,
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
            dq_acc_ptr: workspace + ws_acc as u64,
            flags_ptr: workspace + ws_flags as u64,
            kv_n_blocks: p.seqlen_k.div_ceil(t.kv_block_n) as i32,
            window_left,
            window_right,
            softcap_in,
            softcap_out,
            pad0: 0,
            sinks_ptr: ptrs.sinks,
            dsink_ptr: ptrs.dsink,
            vl_total_q: 0,
            vl_total_k: 0,
            cu_q_ptr: 0,
            cu_k_ptr: 0,
            used_k_ptr: 0,
            used_q_ptr: 0,
            reserved: [0; 2],
        })
    }

    /// Enqueues the three kernels on the context's stream.
    ///
    /// # Safety
    /// Every pointer must be a live device allocation of this context holding what
    /// [`check_backward`] demands of it (checked there from lengths the caller states), and stay
    /// alive until the kernels finish.
    pub unsafe fn launch_raw(&self, ptrs: &BackwardPtrs) -> Result<()> {
        self.launch_kernels(ptrs, [true; 3])
    }

    /// Measurement only: enqueues the chosen kernels of [`BackwardPlan::launch_raw`] (preprocess,
    /// dK/dV, dQ), so each can be timed alone once a full launch has filled the workspace.
    ///
    /// # Safety
    /// As [`BackwardPlan::launch_raw`].
    #[doc(hidden)]
    pub unsafe fn launch_kernels(&self, ptrs: &BackwardPtrs, which: [bool; 3]) -> Result<()> {
        let ws = self
            .workspace
            .as_ref()
            .ok_or_else(|| Error::Other("this backward plan has no workspace of its own".into()))?
            .device_ptr(&self.stream)
            .0;
        self.launch_on(
            ptrs,
            self.contiguous_inputs(),
            ws,
            self.stream.cu_stream(),
            which,
        )
    }

    /// Enqueues the chosen kernels on `stream` with Q, K, V read through `input` strides and
    /// `workspace` ([`workspace_bytes`]) as scratch.
    ///
    /// # Safety
    /// As [`BackwardPlan::launch_raw`], with `workspace` a live, 16-byte aligned allocation of
    /// [`workspace_bytes`] bytes (the dK/dV kernel bulk-copies LSE₂ and D rows out of it) used
    /// by no other launch in flight, `stream` a live stream of
    /// this plan's (primary) context, and Q, K, V covering what their strides reach.
    pub(crate) unsafe fn launch_on(
        &self,
        ptrs: &BackwardPtrs,
        input: InputStrides,
        workspace: u64,
        stream: sys::CUstream,
        which: [bool; 3],
    ) -> Result<()> {
        let p = &self.params;
        let mut kv_block = self.block(ptrs, input, workspace, false)?;
        let mut q_block = self.block(ptrs, input, workspace, true)?;
        let launch = |f: &cudarc::driver::CudaFunction,
                      grid: (u32, u32, u32),
                      threads: u32,
                      smem: usize,
                      block: &mut BwdKernelParams| {
            launch_with_block(f, grid, threads, smem, stream, block)
        };
        let (hq, hkv, b) = (p.heads_q as u32, p.heads_kv as u32, p.batch as u32);
        let t = self.variant.tiles();
        if which[0] {
            let grid = (
                (padded_rows(p.seqlen_q, self.variant) / kb::PREPROCESS_ROWS) as u32,
                hq,
                b,
            );
            launch(
                &self.kernels.preprocess,
                grid,
                kb::PREPROCESS_THREADS,
                0,
                &mut kv_block,
            )?;
            // Learnable sinks: their gradient from the preprocess's workspace (a public choice).
            if ptrs.sinks != 0 {
                launch(
                    &self.kernels.dsink,
                    (hq, 1, 1),
                    kb::DSINK_THREADS,
                    0,
                    &mut kv_block,
                )?;
            }
        }
        if which[1] {
            let grid = (p.seqlen_k.div_ceil(t.kv_block_n) as u32, hkv, b);
            let smem = if self.variant.onepass {
                self.variant.onepass_smem_bytes()
            } else {
                self.variant.dkdv_smem_bytes()
            };
            launch(
                &self.kernels.dkdv,
                grid,
                kb::GEMM_THREADS,
                smem,
                &mut kv_block,
            )?;
        }
        if which[2] && self.variant.onepass {
            // dQ's conversion: one warp per padded row, as the preprocess.
            let grid = (
                (padded_rows(p.seqlen_q, self.variant) / kb::PREPROCESS_ROWS) as u32,
                hq,
                b,
            );
            launch(
                &self.kernels.dq,
                grid,
                kb::PREPROCESS_THREADS,
                0,
                &mut kv_block,
            )?;
        } else if which[2] {
            let grid = (p.seqlen_q.div_ceil(t.q_block_m) as u32, hq, b);
            let smem = self.variant.dq_smem_bytes();
            launch(&self.kernels.dq, grid, kb::GEMM_THREADS, smem, &mut q_block)?;
        }
        Ok(())
    }
}

impl Context {
    /// Prepares the backward for one shape (checks it, loads the variant's kernels, allocates the
    /// workspace).
    pub fn plan_backward(&self, params: &AttentionParams) -> Result<BackwardPlan> {
        check_backward_params(params)?;
        let mut plan = self.plan_backward_external(params)?;
        plan.workspace = Some(self.alloc::<f32>(workspace_bytes(params) / 4)?);
        Ok(plan)
    }

    /// A plan without a workspace of its own, for launches that bring one
    /// ([`BackwardPlan::launch_on`]).
    pub(crate) fn plan_backward_external(&self, params: &AttentionParams) -> Result<BackwardPlan> {
        check_backward_params(params)?;
        let variant = crate::kernels::select::backward(params);
        check_backward_variant(variant)?;
        Ok(BackwardPlan {
            params: params.clone(),
            variant,
            kernels: loaded(self.cuda(), variant)?,
            workspace: None,
            stream: self.stream().clone(),
        })
    }

    /// dQ, dK, dV of attention (the forward of [`Context::attention`] with the same `params`)
    /// from q, k, v, the forward's output `o` and log-sum-exp `lse`, and the output gradient `d_o`
    /// (q's shape). Every buffer is contiguous in `params.layout`; dq has q's shape, dk and dv
    /// k's (GQA: summed over each K/V head's query heads). Bitwise deterministic and
    /// batch-invariant. Every rule is checked before launch ([`check_backward`]): a wrong dtype
    /// (`d_o` included), a wrong length or a missing `lse` is an [`Error::InvalidArgument`]
    /// naming the argument.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward<T: Element, U: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        o: &CudaSlice<T>,
        lse: Option<&CudaSlice<f32>>,
        d_o: &CudaSlice<U>,
        dq: &mut CudaSlice<T>,
        dk: &mut CudaSlice<T>,
        dv: &mut CudaSlice<T>,
    ) -> Result<()> {
        let call = BackwardCall::new(Call::new(params, q, Keys::Dense { k, v }), o, lse, d_o);
        self.run_backward(&call, Grads::new(dq, dk, dv))
    }

    /// As [`Context::attention_backward`] for a forward with learnable sinks
    /// ([`Context::attention_with_sinks`], fp32 `[heads_q]`), also writing their gradient
    /// `dsink` (fp32 `[heads_q]`): `dsink[h] = −Σ_{b,i} exp(sink[h] − LSE[b,h,i]) · D[b,h,i]`
    /// with `D = rowsum(dO ∘ O)`, summed in a fixed order (bitwise deterministic). dQ, dK, dV
    /// need nothing more: the forward's LSE includes the sinks.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward_with_sinks<T: Element, U: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        o: &CudaSlice<T>,
        lse: Option<&CudaSlice<f32>>,
        d_o: &CudaSlice<U>,
        sinks: &CudaSlice<f32>,
        dq: &mut CudaSlice<T>,
        dk: &mut CudaSlice<T>,
        dv: &mut CudaSlice<T>,
        dsink: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let forward = Call::new(params, q, Keys::Dense { k, v }).sinks(sinks);
        let call = BackwardCall::new(forward, o, lse, d_o);
        self.run_backward(&call, Grads::new(dq, dk, dv).dsink(dsink))
    }

    /// The dense backward ([`Context::run_backward`] with [`Keys::Dense`]): every rule checked,
    /// then the plan's launches. `sinks` and `dsink` come together or not at all
    /// ([`check_backward_sinks`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward_checked<T: Element, U: Element>(
        &self,
        params: &AttentionParams,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        o: &CudaSlice<T>,
        lse: Option<&CudaSlice<f32>>,
        d_o: &CudaSlice<U>,
        dq: &mut CudaSlice<T>,
        dk: &mut CudaSlice<T>,
        dv: &mut CudaSlice<T>,
        sinks: Option<&CudaSlice<f32>>,
        dsink: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let s = self.stream();
        let t = T::DTYPE;
        let (q_ptr, _g1) = q.device_ptr(s);
        let (k_ptr, _g2) = k.device_ptr(s);
        let (v_ptr, _g3) = v.device_ptr(s);
        let (o_ptr, _g4) = o.device_ptr(s);
        let (do_ptr, _g5) = d_o.device_ptr(s);
        let lse_info = lse.map(|l| (l.len(), l.device_ptr(s).0));
        let (dq_len, dk_len, dv_len) = (dq.len(), dk.len(), dv.len());
        let (dq_ptr, _g6) = dq.device_ptr_mut(s);
        let (dk_ptr, _g7) = dk.device_ptr_mut(s);
        let (dv_ptr, _g8) = dv.device_ptr_mut(s);
        let bufs = BackwardBuffers {
            q: (t, q.len(), q_ptr),
            k: (t, k.len(), k_ptr),
            v: (t, v.len(), v_ptr),
            o: (t, o.len(), o_ptr),
            d_o: (U::DTYPE, d_o.len(), do_ptr),
            lse: lse_info,
            dq: (t, dq_len, dq_ptr),
            dk: (t, dk_len, dk_ptr),
            dv: (t, dv_len, dv_ptr),
        };
        check_backward(params, &bufs)?;
        let sinks = sinks.map(|sk| (sk.len(), sk.device_ptr(s)));
        let sinks_info = sinks.as_ref().map(|(len, (ptr, _))| (*len, *ptr));
        let dsink = dsink.map(|ds| (ds.len(), ds.device_ptr_mut(s)));
        let dsink_info = dsink.as_ref().map(|(len, (ptr, _))| (*len, *ptr));
        check_backward_sinks(params, sinks_info, dsink_info)?;
        let plan = self.plan_backward(params)?;
        let ptrs = BackwardPtrs {
            q: q_ptr,
            k: k_ptr,
            v: v_ptr,
            o: o_ptr,
            lse: lse_info.map_or(0, |l| l.1),
            d_o: do_ptr,
            dq: dq_ptr,
            dk: dk_ptr,
            dv: dv_ptr,
            sinks: sinks_info.map_or(0, |x| x.1),
            dsink: dsink_info.map_or(0, |x| x.1),
        };
        // SAFETY: every buffer's dtype, length and alignment was checked against the shape.
        unsafe { plan.launch_raw(&ptrs) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::validate::arg_of;

    fn params() -> AttentionParams {
        let mut p = AttentionParams::new(2, 4, 100, 64);
        p.heads_kv = 2;
        p.seqlen_k = 80;
        p
    }

    fn good(p: &AttentionParams) -> BackwardBuffers {
        let d = p.dtype;
        let a = 0x1000u64;
        BackwardBuffers {
            q: (d, p.q_len(), a),
            k: (d, p.kv_len(), a),
            v: (d, p.kv_len(), a),
            o: (d, p.q_len(), a),
            d_o: (d, p.q_len(), a),
            lse: Some((p.lse_len(), a)),
            dq: (d, p.q_len(), a),
            dk: (d, p.kv_len(), a),
            dv: (d, p.kv_len(), a),
        }
    }

    #[test]
    fn a_well_formed_call_passes() {
        let p = params();
        check_backward(&p, &good(&p)).unwrap();
    }

    #[test]
    fn d_o_of_the_wrong_shape_is_rejected() {
        let p = params();
        let mut b = good(&p);
        b.d_o.1 = p.q_len() - p.head_dim;
        assert_eq!(arg_of(check_backward(&p, &b)), "d_o");
    }

    #[test]
    fn d_o_of_the_wrong_dtype_is_rejected() {
        let p = params();
        let mut b = good(&p);
        b.d_o.0 = DType::Bf16;
        let e = check_backward(&p, &b).unwrap_err().to_string();
        assert!(
            e.contains("d_o") && e.contains("bf16") && e.contains("f16"),
            "{e}"
        );
    }

    #[test]
    fn missing_lse_is_rejected_with_what_to_pass() {
        let p = params();
        let mut b = good(&p);
        b.lse = None;
        let e = check_backward(&p, &b).unwrap_err();
        assert!(e.to_string().contains("log-sum-exp"), "{e}");
        assert_eq!(arg_of(Err(e)), "lse");
    }

    #[test]
    fn lse_of_the_wrong_length_is_rejected() {
        let p = params();
        let mut b = good(&p);
        b.lse = Some((p.lse_len() + 1, 0x1000));
        assert_eq!(arg_of(check_backward(&p, &b)), "lse");
    }

    #[test]
    fn outputs_of_the_wrong_shape_or_dtype_are_rejected() {
        let p = params();
        let mut b = good(&p);
        b.dk.1 = p.q_len();
        assert_eq!(arg_of(check_backward(&p, &b)), "dk");
        let mut b = good(&p);
        b.dv.1 = 0;
        assert_eq!(arg_of(check_backward(&p, &b)), "dv");
        let mut b = good(&p);
        b.dq.0 = DType::Bf16;
        assert_eq!(arg_of(check_backward(&p, &b)), "dq");
        let mut b = good(&p);
        b.o.1 += 1;
        assert_eq!(arg_of(check_backward(&p, &b)), "o");
    }

    #[test]
    fn misaligned_tma_operands_are_rejected() {
        let p = params();
        for which in 0..4 {
            let mut b = good(&p);
            let name = match which {
                0 => {
                    b.q.2 += 8;
                    "q"
                }
                1 => {
                    b.k.2 += 2;
                    "k"
                }
                2 => {
                    b.o.2 += 4;
                    "o"
                }
                _ => {
                    b.d_o.2 += 8;
                    "d_o"
                }
            };
            assert_eq!(arg_of(check_backward(&p, &b)), name);
        }
    }

    #[test]
    fn shapes_past_the_grid_limits_are_rejected() {
        let mut p = params();
        p.batch = MAX_GRID_YZ + 1;
        assert_eq!(arg_of(check_backward_params(&p)), "batch");
        let mut p = params();
        p.heads_q = MAX_GRID_YZ + 1;
        p.heads_kv = 1;
        assert_eq!(arg_of(check_backward_params(&p)), "heads_q");
        // The forward's rules apply too.
        let mut p = params();
        p.head_dim = 80;
        assert_eq!(arg_of(check_backward_params(&p)), "head_dim");
    }

    #[test]
    fn the_one_pass_kernels_refuse_head_dims_96_and_256_and_features() {
        for d in crate::spec::SUPPORTED_HEAD_DIMS {
            let two = BwdVariant {
                onepass: false,
                pingpong: true,
                diag: 0,
                ..crate::kernels::select::backward_call(DType::F16, d, false)
            };
            check_backward_variant(two).unwrap();
            let one = BwdVariant {
                onepass: true,
                pingpong: false,
                ..two
            };
            if d == 64 || d == 128 {
                check_backward_variant(one).unwrap();
            } else {
                let (arg, rule) =
                    crate::attention::validate::rule_of(check_backward_variant(one).unwrap_err());
                assert_eq!(arg, "head_dim");
                assert!(rule.contains("one-pass"), "{rule}");
            }
            // The two-pass window/softcap builds exist at every head dim; the one pass has none.
            for softcap in [false, true] {
                let feat = BwdVariant {
                    window: true,
                    softcap,
                    ..two
                };
                check_backward_variant(feat).unwrap();
                let (arg, _) = crate::attention::validate::rule_of(
                    check_backward_variant(BwdVariant {
                        onepass: true,
                        pingpong: false,
                        ..feat
                    })
                    .unwrap_err(),
                );
                let want = if d == 64 || d == 128 {
                    if softcap {
                        "softcap"
                    } else {
                        "window"
                    }
                } else {
                    "head_dim"
                };
                assert_eq!(arg, want);
            }
        }
    }

    #[test]
    fn one_pass_workspace_holds_the_accumulator_and_counters() {
        let p = params(); // B 2, Hq 4, Sq 100 (padded 128), D 64
        let two = crate::kernels::select::backward_call(p.dtype, p.head_dim, p.causal);
        let one = BwdVariant {
            onepass: true,
            pingpong: false,
            diag: 0,
            ..two
        };
        let rows = 2 * 4 * 128;
        let two_pass = BwdVariant {
            onepass: false,
            ..two
        };
        assert_eq!(
            workspace_layout(&p, two_pass),
            (rows * 4, 2 * rows * 4, 2 * rows * 4, 2 * rows * 4)
        );
        let (dvec, acc, flags, end) = workspace_layout(&p, one);
        assert_eq!((dvec, acc), (rows * 4, 2 * rows * 4));
        assert_eq!(flags, acc + rows * 64 * 4);
        // d64 streams 128-row query tiles: one int32 counter per (sequence, head, tile), 2 · 4 · 1.
        assert_eq!(end, flags + 8 * 4);
    }

    #[test]
    fn parameter_block_offsets_match_the_kernel() {
        // kernels/fc_bwd_config.cuh: four 128-byte maps, eight pointers, six strides, then i32s.
        let b = std::mem::MaybeUninit::<BwdKernelParams>::uninit();
        let base = b.as_ptr() as usize;
        // SAFETY: only field addresses are taken, nothing is read.
        let off = |f: *const u8| f as usize - base;
        unsafe {
            let p = b.as_ptr();
            assert_eq!(off(std::ptr::addr_of!((*p).o_ptr) as *const u8), 512);
            assert_eq!(off(std::ptr::addr_of!((*p).q_stride_b) as *const u8), 576);
            assert_eq!(off(std::ptr::addr_of!((*p).batch) as *const u8), 624);
            assert_eq!(off(std::ptr::addr_of!((*p).scale_log2) as *const u8), 648);
            assert_eq!(off(std::ptr::addr_of!((*p).kv_m_blocks) as *const u8), 656);
            assert_eq!(off(std::ptr::addr_of!((*p).dq_acc_ptr) as *const u8), 664);
            assert_eq!(FLAGS_FIELD, 672);
            assert_eq!(off(std::ptr::addr_of!((*p).kv_n_blocks) as *const u8), 680);
            // The window and softcap fields (kernels/fc_bwd_config.cuh).
            assert_eq!(off(std::ptr::addr_of!((*p).window_left) as *const u8), 684);
            assert_eq!(off(std::ptr::addr_of!((*p).window_right) as *const u8), 688);
            assert_eq!(off(std::ptr::addr_of!((*p).softcap_in) as *const u8), 692);
            assert_eq!(off(std::ptr::addr_of!((*p).softcap_out) as *const u8), 696);
            assert_eq!(off(std::ptr::addr_of!((*p).sinks_ptr) as *const u8), 704);
            assert_eq!(off(std::ptr::addr_of!((*p).dsink_ptr) as *const u8), 712);
            // Varlen's.
            assert_eq!(off(std::ptr::addr_of!((*p).vl_total_q) as *const u8), 720);
            assert_eq!(off(std::ptr::addr_of!((*p).vl_total_k) as *const u8), 724);
            assert_eq!(VARLEN_FIELDS, [728, 736, 744, 752]);
            assert_eq!(off(std::ptr::addr_of!((*p).reserved) as *const u8), 760);
        }
    }

    #[test]
    fn sinks_and_their_gradient_come_together_sized_per_query_head() {
        let p = params(); // Hq 4
        let ok = Some((4, 0x1000u64));
        check_backward_sinks(&p, None, None).unwrap();
        check_backward_sinks(&p, ok, ok).unwrap();
        assert_eq!(arg_of(check_backward_sinks(&p, ok, None)), "dsink");
        assert_eq!(arg_of(check_backward_sinks(&p, None, ok)), "sinks");
        assert_eq!(
            arg_of(check_backward_sinks(&p, Some((3, 0x1000)), ok)),
            "sinks"
        );
        assert_eq!(
            arg_of(check_backward_sinks(&p, ok, Some((4, 0x1002)))),
            "dsink"
        );
    }
}
