//! TMA tensor maps (CUtensorMap) for Q, K, V: 4-D views (dim, seq, head, batch) of a tensor
//! with any 16-byte-aligned strides (contiguous `bshd`, `bhsd`, or a framework's strided view), tiled in 64-element (128-byte) rows with 128-byte swizzle (d96: 32-element rows, 64-byte swizzle) — the shared-memory
//! layout the kernel's wgmma descriptors expect. Out-of-range rows read as zeros.

use crate::error::{Error, Result};
use crate::knobs::L2Promotion;
use crate::spec::DType;
use crate::spec::Strides;
use cudarc::driver::sys;

/// Elements per swizzled row: 128 bytes of 16-bit values.
pub const SWIZZLE_ELEMS: u32 = 64;

/// Elements per swizzled row for a head dim: 64 (128-byte swizzle) for multiples of 64, else 32
/// with the 64-byte swizzle (d96: three 64-byte atoms, no padding columns). Must match
/// `cfg::SW_ELEMS` in kernels/fc_config.cuh.
pub fn swizzle_elems(head_dim: usize) -> u32 {
    if head_dim % 64 == 0 {
        SWIZZLE_ELEMS
    } else {
        SWIZZLE_ELEMS / 2
    }
}

fn swizzle_mode(head_dim: usize) -> sys::CUtensorMapSwizzle {
    if swizzle_elems(head_dim) == SWIZZLE_ELEMS {
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
    } else {
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B
    }
}

/// Q in decode mode (kernels/fc_decode.cuh): dims (dim, head, seq, batch) — heads before
/// positions — and a box of `pack` heads by `rows / pack` positions, so one load fills a tile's
/// rows position-major with the query heads that share a K/V head.
#[allow(clippy::too_many_arguments)]
pub fn encode_packed(
    ptr: u64,
    dtype: DType,
    strides: Strides,
    batch: usize,
    seqlen: usize,
    heads: usize,
    head_dim: usize,
    pack: u32,
    rows: u32,
) -> Result<sys::CUtensorMap> {
    let [sb, ss, sh] = byte_strides(strides, dtype);
    let dims: [u64; 4] = [head_dim as u64, heads as u64, seqlen as u64, batch as u64];
    encode_dims(
        ptr,
        dtype,
        dims,
        [sh, ss, sb],
        [swizzle_elems(head_dim), pack, rows / pack, 1],
        L2Promotion::B256,
    )
}

/// (batch, seq, head) element strides, in bytes.
fn byte_strides(strides: Strides, dtype: DType) -> [u64; 3] {
    let esize = dtype.size() as u64;
    strides.as_array().map(|s| s as u64 * esize)
}

#[allow(clippy::too_many_arguments)]
pub fn encode(
    ptr: u64,
    dtype: DType,
    strides: Strides,
    batch: usize,
    seqlen: usize,
    heads: usize,
    head_dim: usize,
    box_rows: u32,
) -> Result<sys::CUtensorMap> {
    encode_with_l2(
        ptr,
        dtype,
        strides,
        [batch, seqlen, heads, head_dim],
        box_rows,
        L2Promotion::B256,
    )
}

/// [`encode`] with the L2 promotion given: `[batch, seqlen, heads, head_dim]` as there.
pub fn encode_with_l2(
    ptr: u64,
    dtype: DType,
    strides: Strides,
    [batch, seqlen, heads, head_dim]: [usize; 4],
    box_rows: u32,
    l2: L2Promotion,
) -> Result<sys::CUtensorMap> {
    let [sb, ss, sh] = byte_strides(strides, dtype);
    let dims: [u64; 4] = [head_dim as u64, seqlen as u64, heads as u64, batch as u64];
    // Byte strides of dims 1..3 (dim 0 is contiguous).
    encode_dims(
        ptr,
        dtype,
        dims,
        [ss, sh, sb],
        [swizzle_elems(head_dim), box_rows, 1, 1],
        l2,
    )
}

/// A 4-D map with the given dims (innermost first), byte strides of dims 1..3 and box.
fn encode_dims(
    ptr: u64,
    dtype: DType,
    dims: [u64; 4],
    strides: [u64; 3],
    boxes: [u32; 4],
    l2: L2Promotion,
) -> Result<sys::CUtensorMap> {
    let elem_strides: [u32; 4] = [1, 1, 1, 1];
    let data_type = match dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    };
    let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
    // SAFETY: all arrays have the rank's length; the driver only writes `map`.
    let rc = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            data_type,
            4,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle_mode(dims[0] as usize),
            match l2 {
                L2Promotion::None => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_NONE,
                L2Promotion::B64 => sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
                L2Promotion::B128 => {
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                }
                L2Promotion::B256 => {
                    sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                }
            },
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Other(format!(
            "cuTensorMapEncodeTiled failed ({rc:?}) for dims {dims:?}, byte strides {strides:?}, box {boxes:?}"
        )));
    }
    // SAFETY: the driver filled the map on success.
    Ok(unsafe { map.assume_init() })
}
