//! The backward pass for torch autograd: `flashcore._native.attention_backward` and its helpers,
//! over `flashcore::attention::backward_external`. Q, K, V come as (pointer, strides) like the
//! forward's; O, dO and the gradients as pointers to tensors contiguous in the call's layout.

use crate::{context, params, tensor, to_py, Features, PyTensor, Shape};
use flashcore::attention::backward::varlen::{varlen_workspace_bytes, ExternalVarlenBackwardCall};
use flashcore::attention::backward::workspace_bytes;
use flashcore::attention::backward_external::{validate_backward, ExternalBackwardCall};
use flashcore::attention::{AttentionParams, Layout};
use pyo3::prelude::*;

/// The pointers of one backward call that are not Q, K, V: (o, lse, d_o, dq, dk, dv, workspace).
type Buffers = (u64, u64, u64, u64, u64, u64, u64);

/// A backward call's features: the forward's window, softcap and sinks (as
/// [`Features`]), and the sinks' gradient buffer (fp32 `[heads_q]`, 0 without sinks).
struct BwdFeatures {
    features: Features,
    dsink: u64,
}

fn backward_params(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    bhsd: bool,
) -> PyResult<AttentionParams> {
    let mut p = params(dtype, shape, causal, scale)?;
    p.layout = if bhsd { Layout::Bhsd } else { Layout::Bshd };
    Ok(p)
}

#[allow(clippy::too_many_arguments)]
fn backward_call(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    bhsd: bool,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    (o, lse, d_o, dq, dk, dv, workspace): Buffers,
    f: BwdFeatures,
) -> PyResult<ExternalBackwardCall> {
    Ok(ExternalBackwardCall {
        params: f
            .features
            .apply(backward_params(dtype, shape, causal, scale, bhsd)?)?,
        q: tensor(q),
        k: tensor(k),
        v: tensor(v),
        o,
        lse,
        d_o,
        dq,
        dk,
        dv,
        workspace,
        sinks: f.features.sinks,
        dsink: f.dsink,
    })
}

/// Checks a backward call's shape, strides, alignment and LSE without touching a GPU. With
/// features: the forward's `window` (flash-attn's, −1 unbounded), `softcap` (0 off) and `sinks` (fp32
/// [Hq] pointer, 0 none), with `dsink` the sinks' gradient (fp32 [Hq], written; 0 without).
#[pyfunction]
#[pyo3(signature = (dtype, shape, causal, scale, bhsd, q, k, v, buffers, window=(-1, -1), softcap=0.0, sinks=0, dsink=0))]
#[allow(clippy::too_many_arguments)]
pub fn validate_attention_backward(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    bhsd: bool,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    buffers: Buffers,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    dsink: u64,
) -> PyResult<()> {
    let f = BwdFeatures {
        features: Features {
            window,
            softcap,
            sinks,
        },
        dsink,
    };
    let c = backward_call(dtype, shape, causal, scale, bhsd, q, k, v, buffers, f)?;
    validate_backward(&c).map_err(to_py)
}

/// Validates, then enqueues the backward (dQ, dK, dV; GQA: dK, dV summed over each group) on
/// `stream` of device `device`. `buffers` = (o, lse, d_o, dq, dk, dv, workspace): O, dO and the
/// gradients contiguous in the layout (`bhsd`: [B, H, S, D], else [B, S, H, D]), lse fp32
/// [B, Hq, Sq], the workspace `backward_workspace_bytes` bytes. The pointers must be live device
/// memory covering what their shapes reach, held by the caller until the kernels have run (the
/// stream orders their reuse). `window`, `softcap`, `sinks`, `dsink` as
/// [`validate_attention_backward`]'s.
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, causal, scale, bhsd, q, k, v, buffers, window=(-1, -1), softcap=0.0, sinks=0, dsink=0))]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    py: Python<'_>,
    device: usize,
    stream: usize,
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    bhsd: bool,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    buffers: Buffers,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    dsink: u64,
) -> PyResult<()> {
    let f = BwdFeatures {
        features: Features {
            window,
            softcap,
            sinks,
        },
        dsink,
    };
    let c = backward_call(dtype, shape, causal, scale, bhsd, q, k, v, buffers, f)?;
    let ctx = context(device)?;
    // The first call of a variant may compile its kernels (NVRTC, seconds): let other threads run.
    py.detach(move || {
        // SAFETY: see the function's doc; the call is validated again inside.
        unsafe { ctx.attention_backward(&c, stream as cudarc::driver::sys::CUstream) }
    })
    .map_err(to_py)
}

/// Bytes of device scratch one backward call needs (the caller allocates it on the call's stream).
/// The mask matters: at d128 causal the default one-pass kernel also needs dQ's fp32 accumulator
/// (a window or softcap call, which runs the two passes, needs no more than its plain mask's).
#[pyfunction]
#[pyo3(signature = (dtype, shape, causal=false))]
pub fn backward_workspace_bytes(dtype: &str, shape: Shape, causal: bool) -> PyResult<usize> {
    Ok(workspace_bytes(&params(dtype, shape, causal, None)?))
}

/// Enqueues the varlen backward on `stream`: packed q [total_q, Hq, D], k, v
/// [total_k, Hkv, D] as (pointer, strides) with `totals` = (total_q, total_k); `buffers` as for
/// `attention_backward` (O, dO, dQ packed like q, dK, dV like k, lse fp32 [Hq, total_q], the
/// workspace `varlen_backward_workspace_bytes` bytes); `meta` = (cu_seqlens_q, cu_seqlens_k,
/// seqused_k, seqused_q) device pointers (0: none). No host synchronisation. The pointers must be
/// live device memory covering what their shapes reach, held by the caller until the kernels run.
/// `window`, `softcap`, `sinks`, `dsink` as [`validate_attention_backward`]'s (windows aligned to
/// each sequence's own lengths; dsink summed over every sequence's rows).
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, causal, scale, q, k, v, totals, buffers, meta, window=(-1, -1), softcap=0.0, sinks=0, dsink=0))]
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_backward(
    py: Python<'_>,
    device: usize,
    stream: usize,
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    totals: (usize, usize),
    buffers: Buffers,
    meta: (u64, u64, u64, u64),
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    dsink: u64,
) -> PyResult<()> {
    let (o, lse, d_o, dq, dk, dv, workspace) = buffers;
    let (cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q) = meta;
    let features = Features {
        window,
        softcap,
        sinks,
    };
    let c = ExternalVarlenBackwardCall {
        params: features.apply(params(dtype, shape, causal, scale)?)?,
        total_q: totals.0,
        total_k: totals.1,
        q: tensor(q),
        k: tensor(k),
        v: tensor(v),
        o,
        lse,
        d_o,
        dq,
        dk,
        dv,
        cu_seqlens_q,
        cu_seqlens_k,
        seqused_k,
        seqused_q,
        workspace,
        sinks,
        dsink,
    };
    let ctx = context(device)?;
    py.detach(move || {
        // SAFETY: see the function's doc; the call is validated inside.
        unsafe { ctx.attention_varlen_backward(&c, stream as cudarc::driver::sys::CUstream) }
    })
    .map_err(to_py)
}

/// Bytes of device scratch one varlen backward call needs (`shape`'s batch is the number of
/// sequences, its lengths max_seqlen_q / max_seqlen_k).
#[pyfunction]
pub fn varlen_backward_workspace_bytes(dtype: &str, shape: Shape, causal: bool) -> PyResult<usize> {
    Ok(varlen_workspace_bytes(&params(dtype, shape, causal, None)?))
}
