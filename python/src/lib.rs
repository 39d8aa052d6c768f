//! `flashcore._native`: the thin layer between the Python package and
//! `flashcore::attention::external`. Python passes plain integers (device pointers, strides, the
//! CUDA stream handle) and shapes; nothing here links libtorch. Every flashcore error becomes a
//! Python exception: bad arguments a `ValueError`, everything else a `RuntimeError`.

mod backward;

use flashcore::attention::external::{self, DeviceTensor, ExternalCall, ExternalContext, Strides};
use flashcore::attention::kv_append::KvAppend;
use flashcore::attention::launch::Lengths;
use flashcore::attention::Pages;
use flashcore::attention::{AttentionParams, DType, Layout, Window};
use flashcore::Error;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

pub(crate) fn to_py(e: Error) -> PyErr {
    match e {
        Error::InvalidArgument { .. } => PyValueError::new_err(format!("flashcore: {e}")),
        other => PyRuntimeError::new_err(format!("flashcore: {other}")),
    }
}

/// A tensor as Python passes it: (device pointer, (batch, seq, head) element strides).
pub(crate) type PyTensor = (u64, (i64, i64, i64));

pub(crate) fn tensor((ptr, (batch, seq, head)): PyTensor) -> DeviceTensor {
    DeviceTensor {
        ptr,
        strides: Strides { batch, seq, head },
    }
}

/// (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim).
pub(crate) type Shape = (usize, usize, usize, usize, usize, usize);

pub(crate) fn params(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
) -> PyResult<AttentionParams> {
    let dtype: DType = dtype.parse().map_err(PyValueError::new_err)?;
    let (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) = shape;
    Ok(AttentionParams {
        batch,
        seqlen_q,
        seqlen_k,
        heads_q,
        heads_kv,
        head_dim,
        dtype,
        layout: Layout::Bshd,
        causal,
        scale: scale.map(|s| s as f32),
        window: Default::default(),
        softcap: 0.0,
    })
}

#[allow(clippy::too_many_arguments)]
fn call(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    out: PyTensor,
    lse: u64,
    lengths: u64,
    workspace: u64,
    kv_lengths: u64,
    kv: KvArgs,
    features: Features,
) -> PyResult<ExternalCall> {
    let p = features.apply(params(dtype, shape, causal, scale)?)?;
    let c = ExternalCall::new(p, tensor(q), tensor(k), tensor(v), tensor(out))
        .sinks(features.sinks)
        .lse(lse)
        .lengths(lengths)
        .kv_lengths(kv_lengths)
        .kv_secret(kv.secret)
        .prefill_consistent(kv.prefill_consistent)
        .kv_starts(kv.starts)
        .workspace(workspace);
    let c = match kv.append {
        Some((k, v, rows, counts)) => c.append(KvAppend {
            k: tensor(k),
            v: tensor(v),
            rows,
            counts,
        }),
        None => c,
    };
    Ok(match kv.pages() {
        Some(pg) => c.paged(kv.block_table, pg),
        None => c,
    })
}

/// The features of a call beyond the plain mask: flash-attn's `window_size` (−1 unbounded), the softcap (0 off)
/// and the learnable sinks' device pointer (fp32 `[heads_q]`, 0 none).
#[derive(Clone, Copy)]
pub(crate) struct Features {
    pub window: (i64, i64),
    pub softcap: f64,
    pub sinks: u64,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            window: (-1, -1),
            softcap: 0.0,
            sinks: 0,
        }
    }
}

impl Features {
    fn apply(&self, mut p: AttentionParams) -> PyResult<AttentionParams> {
        let (l, r) = self.window;
        if l < -1 || r < -1 {
            return Err(PyValueError::new_err(format!(
                "flashcore: window_size sides are -1 (unbounded) or >= 0, got ({l}, {r})"
            )));
        }
        p.window = Window::from_flash_attn(l, r);
        p.softcap = self.softcap as f32;
        Ok(p)
    }
}

/// A KV-cache call's extras: secret counts, a paged cache's block table and geometry
/// (`page_size` 0: contiguous), the prefill-consistent mode (no key splits), each sequence's
/// first key (`cache_leftpad`; 0: none).
#[derive(Clone, Copy, Default)]
struct KvArgs {
    secret: bool,
    block_table: u64,
    page_size: usize,
    num_pages: usize,
    prefill_consistent: bool,
    starts: u64,
    /// New K/V rows to append first (fused): (k, v, rows per sequence, counts buffer).
    append: Option<(PyTensor, PyTensor, usize, u64)>,
}

impl KvArgs {
    fn pages(&self) -> Option<Pages> {
        (self.page_size != 0).then_some(Pages {
            page_size: self.page_size,
            num_pages: self.num_pages,
        })
    }
}

/// One context per device, kept for the life of the process (torch keeps the same primary
/// context alive; dropping ours at interpreter exit would race torch's teardown).
pub(crate) fn context(device: usize) -> PyResult<Arc<ExternalContext>> {
    static CONTEXTS: OnceLock<Mutex<HashMap<usize, Arc<ExternalContext>>>> = OnceLock::new();
    let mut map = CONTEXTS
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| PyRuntimeError::new_err("flashcore: context lock poisoned"))?;
    if let Some(c) = map.get(&device) {
        return Ok(c.clone());
    }
    let c = Arc::new(ExternalContext::new(device).map_err(to_py)?);
    map.insert(device, c.clone());
    Ok(c)
}

/// Checks a call's shapes, alignment and strides without touching a GPU.
#[pyfunction]
#[pyo3(signature = (dtype, shape, causal, scale, q, k, v, out, lse=0, lengths=0, workspace=0, kv_lengths=0, kv_secret=false, block_table=0, page_size=0, num_pages=0, kv_prefill_consistent=false, kv_starts=0, window=(-1, -1), softcap=0.0, sinks=0, append=None))]
#[allow(clippy::too_many_arguments)]
fn validate(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    out: PyTensor,
    lse: u64,
    lengths: u64,
    workspace: u64,
    kv_lengths: u64,
    kv_secret: bool,
    block_table: u64,
    page_size: usize,
    num_pages: usize,
    kv_prefill_consistent: bool,
    kv_starts: u64,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    append: Option<(PyTensor, PyTensor, usize, u64)>,
) -> PyResult<()> {
    let kv = KvArgs {
        secret: kv_secret,
        block_table,
        page_size,
        num_pages,
        prefill_consistent: kv_prefill_consistent,
        starts: kv_starts,
        append,
    };
    let f = Features {
        window,
        softcap,
        sinks,
    };
    let c = call(
        dtype, shape, causal, scale, q, k, v, out, lse, lengths, workspace, kv_lengths, kv, f,
    )?;
    external::validate(&c).map_err(to_py)
}

/// Validates, then enqueues the kernel on `stream` (a `cudaStream_t` as an integer, e.g.
/// `torch.cuda.current_stream().cuda_stream`) of device `device`. The pointers must be live
/// device memory covering what the strides reach; the Python package guarantees that by
/// passing tensors it holds until the op returns (the stream orders their reuse).
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, causal, scale, q, k, v, out, lse=0, lengths=0, workspace=0, kv_lengths=0, kv_secret=false, block_table=0, page_size=0, num_pages=0, kv_prefill_consistent=false, kv_starts=0, window=(-1, -1), softcap=0.0, sinks=0, append=None, tile_counter=0))]
#[allow(clippy::too_many_arguments)]
fn attention(
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
    out: PyTensor,
    lse: u64,
    lengths: u64,
    workspace: u64,
    kv_lengths: u64,
    kv_secret: bool,
    block_table: u64,
    page_size: usize,
    num_pages: usize,
    kv_prefill_consistent: bool,
    kv_starts: u64,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    append: Option<(PyTensor, PyTensor, usize, u64)>,
    tile_counter: u64,
) -> PyResult<()> {
    let kv = KvArgs {
        secret: kv_secret,
        block_table,
        page_size,
        num_pages,
        prefill_consistent: kv_prefill_consistent,
        starts: kv_starts,
        append,
    };
    let f = Features {
        window,
        softcap,
        sinks,
    };
    let c = call(
        dtype, shape, causal, scale, q, k, v, out, lse, lengths, workspace, kv_lengths, kv, f,
    )?
    .tile_counter(tile_counter);
    launch(py, device, stream, c)
}

/// u32 words of the dynamic tile order's counter (`attention`'s `tile_counter`) on a device of
/// `num_sms` SMs.
#[pyfunction]
fn tile_counter_words(num_sms: usize) -> usize {
    external::tile_counter_words(num_sms)
}

/// [`attention`] for the plain KV-cache call (`_launch.decode`'s: a contiguous cache, public
/// counts `kv_lengths`, fused new rows `append` or none, nothing else), with only the arguments
/// that call sets: the same launch as `attention` with every other argument at its default, for
/// ten fewer conversions per call (host time).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn attention_kv(
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
    out: PyTensor,
    lse: u64,
    workspace: u64,
    kv_lengths: u64,
    append: Option<(PyTensor, PyTensor, usize, u64)>,
) -> PyResult<()> {
    let kv = KvArgs {
        append,
        ..Default::default()
    };
    let c = call(
        dtype,
        shape,
        causal,
        scale,
        q,
        k,
        v,
        out,
        lse,
        0,
        workspace,
        kv_lengths,
        kv,
        Features::default(),
    )?;
    launch(py, device, stream, c)
}

/// Enqueues a built call on `stream` of device `device` (see [`attention`]).
fn launch(py: Python<'_>, device: usize, stream: usize, c: ExternalCall) -> PyResult<()> {
    let ctx = context(device)?;
    // A loaded kernel is enqueued holding the GIL, as torch enqueues its own: releasing it would
    // hand it to any other Python thread for up to its switch interval (and costs host time).
    // SAFETY: see `attention`'s doc; the call is validated inside.
    if unsafe { ctx.attention_loaded(&c, stream as cudarc::driver::sys::CUstream) }
        .map_err(to_py)?
    {
        return Ok(());
    }
    // The first call of a shape may compile a kernel (NVRTC, seconds): let other threads run.
    py.detach(move || {
        // SAFETY: see `attention`'s doc; the call is validated again inside.
        unsafe { ctx.attention(&c, stream as cudarc::driver::sys::CUstream) }
    })
    .map_err(to_py)
}

/// Loads (compiling on first use) the kernel for a shape without launching: the warm-up to do
/// before capturing a CUDA graph.
#[pyfunction]
#[pyo3(signature = (device, dtype, shape, causal, scale, secret_lengths=false, kv_lengths=false, kv_secret=false, page_size=0, num_pages=0, kv_prefill_consistent=false, window=(-1, -1), softcap=0.0))]
#[allow(clippy::too_many_arguments)]
fn prepare(
    py: Python<'_>,
    device: usize,
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    secret_lengths: bool,
    kv_lengths: bool,
    kv_secret: bool,
    page_size: usize,
    num_pages: usize,
    kv_prefill_consistent: bool,
    window: (i64, i64),
    softcap: f64,
) -> PyResult<()> {
    let f = Features {
        window,
        softcap,
        sinks: 0,
    };
    let p = f.apply(params(dtype, shape, causal, scale)?)?;
    let ctx = context(device)?;
    let kv = KvArgs {
        secret: kv_secret,
        page_size,
        num_pages,
        prefill_consistent: kv_prefill_consistent,
        ..Default::default()
    };
    let lengths = lengths_mode(secret_lengths, kv_lengths, kv);
    py.detach(move || ctx.prepare_lengths(&p, lengths))
        .map_err(to_py)
}

fn lengths_mode(secret_lengths: bool, kv_lengths: bool, kv: KvArgs) -> Lengths {
    if kv_lengths {
        Lengths::KvCache {
            secret: kv.secret,
            pages: kv.pages(),
            prefill_consistent: kv.prefill_consistent,
        }
    } else if secret_lengths {
        Lengths::SecretPadded
    } else {
        Lengths::None
    }
}

/// Bytes of scratch a call needs on the device (decode mode's split partials; 0 for most calls):
/// the caller allocates it on the call's stream and passes its address as `workspace`.
#[pyfunction]
#[pyo3(signature = (dtype, shape, causal, secret_lengths=false, kv_lengths=false, kv_prefill_consistent=false))]
fn workspace_bytes(
    dtype: &str,
    shape: Shape,
    causal: bool,
    secret_lengths: bool,
    kv_lengths: bool,
    kv_prefill_consistent: bool,
) -> PyResult<usize> {
    let p = params(dtype, shape, causal, None)?;
    let kv = KvArgs {
        prefill_consistent: kv_prefill_consistent,
        ..Default::default()
    };
    Ok(flashcore::attention::decode::workspace_bytes(
        &p,
        // Splits come from the capacity in every KV-cache mode (none in the prefill-consistent
        // one): secrecy and paging do not change the size.
        lengths_mode(secret_lengths, kv_lengths, kv),
    ))
}

/// A varlen call: `shape` = (sequences, max_seqlen_q, max_seqlen_k, heads_q,
/// heads_kv, head_dim); q/out `[total_q, Hq, D]`, k/v `[total_k, Hkv, D]` given as (pointer,
/// (0, seq stride, head stride)); `lse` fp32 `[Hq, total_q]` or 0; `cu_seqlens_*` i32 device
/// pointers; `seqused_k`, `seqused_q` 0 for none; `workspace` of `varlen_workspace_bytes`.
/// `pages` = (block table pointer, page size, pages in the pool, left padded): k/v are a paged
/// cache's pools `[num_pages, page_size, Hkv, D]` given as (pointer, (page stride, row stride,
/// head stride)), max_seqlen_k is the capacity and the pack's keys are virtual rows
/// (`VarlenPages`).
#[allow(clippy::too_many_arguments)]
fn varlen_call(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    tensors: [PyTensor; 4],
    totals: (usize, usize),
    lse: u64,
    meta: (u64, u64, u64, u64),
    workspace: u64,
    features: Features,
    pages: Option<VarlenPagesArg>,
) -> PyResult<external::VarlenCall> {
    let [q, k, v, out] = tensors;
    Ok(external::VarlenCall {
        pages: pages.map(|(block_table, page_size, num_pages, left_padded)| {
            external::varlen::VarlenPages {
                block_table,
                pages: Pages {
                    page_size,
                    num_pages,
                },
                left_padded,
            }
        }),
        params: features.apply(params(dtype, shape, causal, scale)?)?,
        total_q: totals.0,
        total_k: totals.1,
        q: tensor(q),
        k: tensor(k),
        v: tensor(v),
        out: tensor(out),
        lse,
        cu_seqlens_q: meta.0,
        cu_seqlens_k: meta.1,
        seqused_k: meta.2,
        seqused_q: meta.3,
        workspace,
        sinks: features.sinks,
    })
}

/// A paged cache behind a varlen call: (block table pointer, page size, pages in the pool,
/// left padded).
type VarlenPagesArg = (u64, usize, usize, bool);

/// Checks a varlen call's shapes, alignment and strides without touching a GPU.
#[pyfunction]
#[pyo3(signature = (dtype, shape, causal, scale, q, k, v, out, totals, lse, meta, workspace, window=(-1, -1), softcap=0.0, sinks=0, pages=None))]
#[allow(clippy::too_many_arguments)]
fn validate_varlen(
    dtype: &str,
    shape: Shape,
    causal: bool,
    scale: Option<f64>,
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    out: PyTensor,
    totals: (usize, usize),
    lse: u64,
    meta: (u64, u64, u64, u64),
    workspace: u64,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    pages: Option<VarlenPagesArg>,
) -> PyResult<()> {
    let features = Features {
        window,
        softcap,
        sinks,
    };
    let c = varlen_call(
        dtype,
        shape,
        causal,
        scale,
        [q, k, v, out],
        totals,
        lse,
        meta,
        workspace,
        features,
        pages,
    )?;
    external::validate_varlen(&c).map_err(to_py)
}

/// Validates, then enqueues a varlen call on `stream` of device `device`: the work list is built
/// on the device from `cu_seqlens` (no host synchronisation; capturable).
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, causal, scale, q, k, v, out, totals, lse, meta, workspace, window=(-1, -1), softcap=0.0, sinks=0, pages=None))]
#[allow(clippy::too_many_arguments)]
fn attention_varlen(
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
    out: PyTensor,
    totals: (usize, usize),
    lse: u64,
    meta: (u64, u64, u64, u64),
    workspace: u64,
    window: (i64, i64),
    softcap: f64,
    sinks: u64,
    pages: Option<VarlenPagesArg>,
) -> PyResult<()> {
    let features = Features {
        window,
        softcap,
        sinks,
    };
    let c = varlen_call(
        dtype,
        shape,
        causal,
        scale,
        [q, k, v, out],
        totals,
        lse,
        meta,
        workspace,
        features,
        pages,
    )?;
    let ctx = context(device)?;
    py.detach(move || {
        // SAFETY: see the function's doc; the call is validated again inside.
        unsafe { ctx.attention_varlen(&c, stream as cudarc::driver::sys::CUstream) }
    })
    .map_err(to_py)
}

/// Loads the varlen kernel of a shape for `stream` (each stream has its own instance: its work
/// list): the warm-up before capturing a CUDA graph on that stream. A softcap (any value > 0)
/// and a paged cache (`paged`) select their own builds.
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, causal, softcap=0.0, paged=false))]
#[allow(clippy::too_many_arguments)]
fn prepare_varlen(
    py: Python<'_>,
    device: usize,
    stream: usize,
    dtype: &str,
    shape: Shape,
    causal: bool,
    softcap: f64,
    paged: bool,
) -> PyResult<()> {
    let f = Features {
        softcap,
        ..Default::default()
    };
    let p = f.apply(params(dtype, shape, causal, None)?)?;
    let ctx = context(device)?;
    py.detach(move || ctx.prepare_varlen(&p, paged, stream as cudarc::driver::sys::CUstream))
        .map_err(to_py)
}

/// Bytes of device workspace a varlen call of this shape needs (its device-built work list).
#[pyfunction]
fn varlen_workspace_bytes(dtype: &str, shape: Shape, causal: bool) -> PyResult<usize> {
    let p = params(dtype, shape, causal, None)?;
    Ok(external::varlen::workspace_bytes(&p))
}

/// Opens device `device` (typed errors without a driver, without a device, on a non-sm_90 GPU)
/// and returns (name, number of SMs).
#[pyfunction]
fn device_info(device: usize) -> PyResult<(String, usize)> {
    let ctx = context(device)?;
    Ok((ctx.context().device_name(), ctx.context().num_sms()))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(attention, m)?)?;
    m.add_function(wrap_pyfunction!(attention_kv, m)?)?;
    m.add_function(wrap_pyfunction!(tile_counter_words, m)?)?;
    m.add_function(wrap_pyfunction!(prepare, m)?)?;
    m.add_function(wrap_pyfunction!(device_info, m)?)?;
    m.add_function(wrap_pyfunction!(workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(validate_varlen, m)?)?;
    m.add_function(wrap_pyfunction!(attention_varlen, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_varlen, m)?)?;
    m.add_function(wrap_pyfunction!(varlen_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(backward::attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(backward::validate_attention_backward, m)?)?;
    m.add_function(wrap_pyfunction!(backward::backward_workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(backward::attention_varlen_backward, m)?)?;
    m.add_function(wrap_pyfunction!(
        backward::varlen_backward_workspace_bytes,
        m
    )?)?;
    m.add(
        "DECODE_MAX_SEQLEN_Q",
        flashcore::attention::decode::MAX_SEQLEN_Q,
    )?;
    // The head dims from the variant table (the rows the support matrix lists): the Python checks
    // and `flashcore.SUPPORTED_HEAD_DIMS` read these instead of keeping lists of their own.
    use flashcore::kernels::table;
    m.add("SUPPORTED_HEAD_DIMS", table::forward_head_dims())?;
    m.add("BACKWARD_HEAD_DIMS", table::backward_head_dims(|_| true))?;
    m.add(
        "VARLEN_BACKWARD_HEAD_DIMS",
        table::backward_head_dims(|f| f.varlen),
    )?;
    m.add(
        "FEATURE_BACKWARD_HEAD_DIMS",
        table::backward_head_dims(|f| f.window),
    )?;
    Ok(())
}
