//! The shipped variants as one table of data: each row a family of builds, made for every dtype
//! and for the head dims and masks it lists. The audit's shipped set, the selection's check that
//! a knob asks for a shipped build, the kernel-build tests and the support matrix
//! (`docs/support.md`, [`support_matrix`]) all read these rows, and so do the Python package's
//! head-dim lists ([`forward_head_dims`], [`backward_head_dims`]).
//!
//! A new head dim is a change to `spec::SUPPORTED_HEAD_DIMS` and `BACKWARD_HEAD_DIMS` (the rows
//! built at every head dim follow, and with them selection, the audit's set, the test loops and
//! the Python lists) and to the tile and register rules it needs: the backward's tiles on the
//! host (`BwdVariant::tiles`), the CUDA configs' head-dim checks and register splits
//! (`kernels/fc_config.cuh`, `kernels/fc_bwd_config.cuh`), any per-width load
//! (`kernels/fc_bwd_preprocess.cuh`) and the P·V wgmma width (`scripts/gen_wgmma.py`, which
//! writes `kernels/fc_wgmma_ops.cuh`); then `docs/support.md` is regenerated. No test or doc lists
//! head dims by hand.

use super::backward::{BwdVariant, ONEPASS_HEAD_DIMS, SHIPPED_CORES};
use super::{block_n_for, Variant};
use crate::spec::limits::head_dim_list;
use crate::spec::{DType, BACKWARD_HEAD_DIMS, SUPPORTED_HEAD_DIMS};

/// Both dtypes every family is built for.
pub const DTYPES: [DType; 2] = [DType::F16, DType::Bf16];

/// The head dims a family is built at.
#[derive(Debug, Clone, Copy)]
pub enum HeadDims {
    /// Every supported head dim (`spec::SUPPORTED_HEAD_DIMS`, or the backward's list).
    All,
    Only(&'static [usize]),
}

/// The masks a family is built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Masks {
    Both,
    FullOnly,
}

impl Masks {
    fn causal(self) -> &'static [bool] {
        match self {
            Masks::Both => &[false, true],
            Masks::FullOnly => &[false],
        }
    }
}

/// One row of the forward table: a family of builds differing only in dtype, head dim and mask.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// What the family is for, as the support matrix names it.
    pub name: &'static str,
    pub head_dims: HeadDims,
    pub masks: Masks,
    /// Query rows per CTA.
    pub block_m: usize,
    /// Keys per stage; `None`: [`block_n_for`] the head dim.
    pub block_n: Option<usize>,
    pub split: usize,
    pub secret_len: bool,
    pub decode: bool,
    pub kv_public: bool,
    pub paged: bool,
    pub varlen: bool,
    pub softcap: bool,
}

/// A row with every flag off: the plain 128-row prefill tile, one CTA per query tile.
const PREFILL: Family = Family {
    name: "prefill",
    head_dims: HeadDims::All,
    masks: Masks::Both,
    block_m: 128,
    block_n: None,
    split: 1,
    secret_len: false,
    decode: false,
    kv_public: false,
    paged: false,
    varlen: false,
    softcap: false,
};

/// Decode's tile: 64 GQA-packed rows, the key range split into work units.
const DECODE: Family = Family {
    name: "decode",
    block_m: 64,
    decode: true,
    ..PREFILL
};

/// A KV cache's decode build: key counts public (the walk ends at each) or secret (the capacity
/// is walked and masked by select), contiguous or paged.
const fn kv_cache(name: &'static str, secret: bool, paged: bool, softcap: bool) -> Family {
    Family {
        name,
        secret_len: secret,
        kv_public: !secret,
        paged,
        softcap,
        ..DECODE
    }
}

/// Split variants exist at d64 only: at d128 the fp32 partials would not fit beside a two-stage
/// K/V ring.
const SPLIT_HEAD_DIMS: &[usize] = &[64];

/// Every shipped forward family. Order matters only for reports: variants are listed per
/// (dtype, head dim, mask), in row order.
pub const FORWARD: &[Family] = &[
    PREFILL,
    Family {
        name: "prefill, keys split over a 2-CTA cluster",
        head_dims: HeadDims::Only(SPLIT_HEAD_DIMS),
        split: 2,
        ..PREFILL
    },
    Family {
        name: "prefill, keys split over a 4-CTA cluster",
        head_dims: HeadDims::Only(SPLIT_HEAD_DIMS),
        split: 4,
        ..PREFILL
    },
    Family {
        name: "secret-length prefill",
        secret_len: true,
        ..PREFILL
    },
    Family {
        name: "secret-length prefill, 2-CTA split",
        head_dims: HeadDims::Only(SPLIT_HEAD_DIMS),
        secret_len: true,
        split: 2,
        ..PREFILL
    },
    Family {
        name: "secret-length prefill, 4-CTA split",
        head_dims: HeadDims::Only(SPLIT_HEAD_DIMS),
        secret_len: true,
        split: 4,
        ..PREFILL
    },
    // Light tiles for launches that cannot fill the GPU (Variant::with_light_tiles).
    Family {
        name: "prefill, light 64-row tiles",
        block_m: 64,
        ..PREFILL
    },
    DECODE,
    Family {
        name: "varlen prefill",
        varlen: true,
        ..PREFILL
    },
    // Chunked prefill over a paged cache: the varlen tile, K/V through the block table.
    Family {
        name: "varlen prefill, paged KV cache",
        varlen: true,
        paged: true,
        ..PREFILL
    },
    kv_cache("KV cache, public counts", false, false, false),
    kv_cache("KV cache, public counts, paged", false, true, false),
    kv_cache("KV cache, secret counts", true, false, false),
    kv_cache("KV cache, secret counts, paged", true, true, false),
    // Softcap builds: only the tiles a softcap call can select (Variant::with_softcap).
    Family {
        name: "prefill, softcap",
        softcap: true,
        ..PREFILL
    },
    Family {
        name: "varlen prefill, softcap",
        varlen: true,
        softcap: true,
        ..PREFILL
    },
    Family {
        name: "varlen prefill, paged KV cache, softcap",
        varlen: true,
        paged: true,
        softcap: true,
        ..PREFILL
    },
    kv_cache("KV cache, public counts, softcap", false, false, true),
    kv_cache("KV cache, public counts, paged, softcap", false, true, true),
    kv_cache("KV cache, secret counts, softcap", true, false, true),
    kv_cache("KV cache, secret counts, paged, softcap", true, true, true),
    // Long queries at d64: three consumer warpgroups (Variant::for_shape).
    Family {
        name: "prefill, 192-row tiles",
        head_dims: HeadDims::Only(&[64]),
        block_m: 192,
        block_n: Some(128),
        ..PREFILL
    },
    // d128 non-causal from Sk = 4096: 176-key blocks, in 128-row and light 64-row tiles.
    Family {
        name: "prefill, light 64-row tiles, 176-key blocks",
        head_dims: HeadDims::Only(&[128]),
        masks: Masks::FullOnly,
        block_m: 64,
        block_n: Some(176),
        ..PREFILL
    },
    Family {
        name: "prefill, 176-key blocks",
        head_dims: HeadDims::Only(&[128]),
        masks: Masks::FullOnly,
        block_n: Some(176),
        ..PREFILL
    },
    // d256: 80-key blocks, in 128-row and light 64-row tiles, causal and not.
    Family {
        name: "prefill, light 64-row tiles, 80-key blocks",
        head_dims: HeadDims::Only(&[256]),
        masks: Masks::Both,
        block_m: 64,
        block_n: Some(80),
        ..PREFILL
    },
    Family {
        name: "prefill, 80-key blocks",
        head_dims: HeadDims::Only(&[256]),
        masks: Masks::Both,
        block_n: Some(80),
        ..PREFILL
    },
];

impl Family {
    pub fn head_dims(&self) -> &'static [usize] {
        match self.head_dims {
            HeadDims::All => &SUPPORTED_HEAD_DIMS,
            HeadDims::Only(d) => d,
        }
    }

    /// The family's build for one dtype, head dim and mask.
    pub fn variant(&self, dtype: DType, head_dim: usize, causal: bool) -> Variant {
        Variant {
            dtype,
            head_dim,
            causal,
            block_m: self.block_m,
            block_n: self.block_n.unwrap_or(block_n_for(head_dim)),
            secret_len: self.secret_len,
            split: self.split,
            decode: self.decode,
            kv_public: self.kv_public,
            paged: self.paged,
            varlen: self.varlen,
            softcap: self.softcap,
        }
    }
}

/// Every forward variant the library can launch: the table's rows for each dtype, head dim and
/// mask.
pub fn forward_variants() -> Vec<Variant> {
    let mut v = Vec::new();
    for dtype in DTYPES {
        for head_dim in SUPPORTED_HEAD_DIMS {
            for causal in [false, true] {
                for f in FORWARD {
                    if f.head_dims().contains(&head_dim) && f.masks.causal().contains(&causal) {
                        v.push(f.variant(dtype, head_dim, causal));
                    }
                }
            }
        }
    }
    v
}

/// Sorted, without repeats: the head dims a set of families is built at.
fn union(dims: impl Iterator<Item = &'static [usize]>) -> Vec<usize> {
    let mut v: Vec<usize> = dims.flatten().copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The head dims some forward family is built at, ascending: what a forward call may ask for, as
/// the support matrix and the Python package (`flashcore.SUPPORTED_HEAD_DIMS`) state it.
pub fn forward_head_dims() -> Vec<usize> {
    union(FORWARD.iter().map(Family::head_dims))
}

/// One row of the backward table.
#[derive(Debug, Clone, Copy)]
pub struct BwdFamily {
    pub name: &'static str,
    pub head_dims: HeadDims,
    pub masks: Masks,
    pub pingpong: bool,
    pub onepass: bool,
    pub window: bool,
    pub softcap: bool,
    pub varlen: bool,
    /// 80-row query tiles ([`BwdVariant::qrows80`]).
    pub qrows80: bool,
    /// The 80-row build at 24/240 registers ([`BwdVariant::regs240`]).
    pub regs240: bool,
    /// The one-pass tile schedules shipped for this row ([`BwdVariant::core`]; 0 for two passes).
    pub cores: &'static [u8],
}

const TWO_PASS: BwdFamily = BwdFamily {
    name: "two passes",
    head_dims: HeadDims::All,
    masks: Masks::Both,
    pingpong: true,
    onepass: false,
    window: false,
    softcap: false,
    varlen: false,
    qrows80: false,
    regs240: false,
    cores: &[0],
};

/// Every shipped backward family. Softcap runs in the window build (an unbounded window masks
/// nothing); the one pass serves neither, nor varlen.
pub const BACKWARD: &[BwdFamily] = &[
    TWO_PASS,
    BwdFamily {
        name: "two passes, lockstep consumers",
        pingpong: false,
        ..TWO_PASS
    },
    BwdFamily {
        name: "one pass",
        head_dims: HeadDims::Only(&ONEPASS_HEAD_DIMS),
        pingpong: false,
        onepass: true,
        cores: &SHIPPED_CORES,
        ..TWO_PASS
    },
    // d128 without a causal mask: the one pass on 80-row query tiles, the default there.
    BwdFamily {
        name: "one pass, 80-row query tiles",
        head_dims: HeadDims::Only(&[128]),
        masks: Masks::FullOnly,
        pingpong: false,
        onepass: true,
        qrows80: true,
        cores: &[3],
        ..TWO_PASS
    },
    // The same at a 24/240 register split (two overlaps the 232-register build gives up);
    // FLASHCORE_BWD_REGS=240 selects it.
    BwdFamily {
        name: "one pass, 80-row query tiles, 240-register consumers",
        head_dims: HeadDims::Only(&[128]),
        masks: Masks::FullOnly,
        pingpong: false,
        onepass: true,
        qrows80: true,
        regs240: true,
        cores: &[3],
        ..TWO_PASS
    },
    BwdFamily {
        name: "two passes, window",
        window: true,
        ..TWO_PASS
    },
    BwdFamily {
        name: "two passes, window and softcap",
        window: true,
        softcap: true,
        ..TWO_PASS
    },
    BwdFamily {
        name: "varlen",
        varlen: true,
        ..TWO_PASS
    },
    BwdFamily {
        name: "varlen, window",
        varlen: true,
        window: true,
        ..TWO_PASS
    },
    BwdFamily {
        name: "varlen, window and softcap",
        varlen: true,
        window: true,
        softcap: true,
        ..TWO_PASS
    },
];

impl BwdFamily {
    pub fn head_dims(&self) -> &'static [usize] {
        match self.head_dims {
            HeadDims::All => &BACKWARD_HEAD_DIMS,
            HeadDims::Only(d) => d,
        }
    }

    pub fn variant(&self, dtype: DType, head_dim: usize, causal: bool, core: u8) -> BwdVariant {
        BwdVariant {
            dtype,
            head_dim,
            causal,
            pingpong: self.pingpong,
            onepass: self.onepass,
            diag: 0,
            core,
            window: self.window,
            softcap: self.softcap,
            varlen: self.varlen,
            qrows80: self.qrows80,
            regs240: self.regs240,
        }
    }
}

/// The head dims the backward families that `pick` keeps are built at, ascending (the Python
/// package's `BACKWARD_HEAD_DIMS` keeps every family; its varlen and feature lists keep those rows).
pub fn backward_head_dims(pick: impl Fn(&BwdFamily) -> bool) -> Vec<usize> {
    union(
        BACKWARD
            .iter()
            .filter(|f| pick(f))
            .map(BwdFamily::head_dims),
    )
}

/// Every backward variant the library can launch.
pub fn backward_variants() -> Vec<BwdVariant> {
    let mut v = Vec::new();
    for dtype in DTYPES {
        for head_dim in BACKWARD_HEAD_DIMS {
            for causal in [false, true] {
                for f in BACKWARD {
                    if f.head_dims().contains(&head_dim) && f.masks.causal().contains(&causal) {
                        for &core in f.cores {
                            v.push(f.variant(dtype, head_dim, causal, core));
                        }
                    }
                }
            }
        }
    }
    v
}

/// The support matrix as Markdown, generated from the tables (`docs/support.md`; a test checks
/// the file matches).
pub fn support_matrix() -> String {
    let mut s = String::from(
        "# Support matrix\n\n\
         Generated from the variant table (`src/kernels/table.rs`) by\n\
         `WRITE_SUPPORT_MATRIX=1 cargo test --release --test support_matrix`; the test fails when\n\
         this file and the table disagree. Every row is built for f16 and bf16; each build is\n\
         compiled, audited and launchable. Which build a call runs is decided in\n\
         `src/kernels/select.rs`.\n\n",
    );
    // The one place the docs state the head dims; the Python package reads the same table.
    s += &format!(
        "**Head dims:** {} (forward); {} (backward). In Python: `flashcore.SUPPORTED_HEAD_DIMS`,\n\
         `flashcore.BACKWARD_HEAD_DIMS` (read from this table).\n\n",
        head_dim_list(&forward_head_dims()),
        head_dim_list(&backward_head_dims(|_| true))
    );
    s += "## Forward\n\n\
          | Family | Head dims | Masks | Tile (query rows × keys) |\n\
          |---|---|---|---|\n";
    for f in FORWARD {
        let keys = match f.block_n {
            Some(n) => n.to_string(),
            None => {
                // The default rule: 128 keys, fewer where the head dim leaves no room.
                let d = f.head_dims();
                let n0 = block_n_for(d[0]);
                let other: Vec<usize> = d
                    .iter()
                    .copied()
                    .filter(|&x| block_n_for(x) != n0)
                    .collect();
                match other.first() {
                    None => n0.to_string(),
                    Some(&x) => format!("{n0} ({} at d{})", block_n_for(x), head_dim_list(&other)),
                }
            }
        };
        s += &format!(
            "| {} | {} | {} | {} × {} |\n",
            f.name,
            head_dim_list(f.head_dims()),
            match f.masks {
                Masks::Both => "causal, full",
                Masks::FullOnly => "full",
            },
            f.block_m,
            keys
        );
    }
    s += "\n## Backward\n\n| Family | Head dims | Masks |\n|---|---|---|\n";
    for f in BACKWARD {
        s += &format!(
            "| {} | {} | {} |\n",
            f.name,
            head_dim_list(f.head_dims()),
            match f.masks {
                Masks::Both => "causal, full",
                Masks::FullOnly => "full",
            }
        );
    }
    s += &format!(
        "\n{} forward and {} backward variants.\n",
        forward_variants().len(),
        backward_variants().len()
    );
    s
}
