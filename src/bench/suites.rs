//! The named suites of shapes. `bench/sdpa.py` holds the same lists (a CPU test compares them).

use crate::attention::{AttentionParams, DType, Layout};

/// A named list of shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// The seed shapes: latency (1,8,512,64), (1,16,1024,64), and throughput shapes up to 16k.
    Seed,
    /// FlashAttention-3 paper sweep: 16k tokens, S = 512..16k, D ∈ {64, 128}, hidden 2048.
    Fa3,
}

impl Suite {
    pub fn name(self) -> &'static str {
        match self {
            Suite::Seed => "seed",
            Suite::Fa3 => "fa3",
        }
    }

    /// The suite's shapes in `layout`, in run order.
    pub fn shapes(self, layout: Layout) -> Vec<AttentionParams> {
        match self {
            Suite::Seed => seed(layout),
            Suite::Fa3 => fa3(layout),
        }
    }
}

/// fp16 then bf16 × (B, H, S, D, causal): (1,8,512,64) causal and not; (1,16,1024,64) causal;
/// (16,16,2048,64) causal and not; (2,16,8192,128) causal and not; (1,16,16384,128) non-causal.
pub fn seed(layout: Layout) -> Vec<AttentionParams> {
    const SHAPES: [(usize, usize, usize, usize, bool); 8] = [
        (1, 8, 512, 64, false),
        (1, 8, 512, 64, true),
        (1, 16, 1024, 64, true),
        (16, 16, 2048, 64, false),
        (16, 16, 2048, 64, true),
        (2, 16, 8192, 128, false),
        (2, 16, 8192, 128, true),
        (1, 16, 16384, 128, false),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for (b, h, s, d, causal) in SHAPES {
            out.push(
                AttentionParams::new(b, h, s, d)
                    .dtype(dtype)
                    .layout(layout)
                    .causal(causal),
            );
        }
    }
    out
}

/// fp16 then bf16 × D ∈ {64, 128} × non-causal then causal × S ∈ {512, …, 16384}, with
/// B = 16384 / S and H = 2048 / D.
pub fn fa3(layout: Layout) -> Vec<AttentionParams> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for d in [64usize, 128] {
            for causal in [false, true] {
                for s in [512usize, 1024, 2048, 4096, 8192, 16384] {
                    out.push(
                        AttentionParams::new(16384 / s, 2048 / d, s, d)
                            .dtype(dtype)
                            .layout(layout)
                            .causal(causal),
                    );
                }
            }
        }
    }
    out
}

/// A short label: `b1 h8 s512 d64` (`h32/8` with grouped heads, `s512/1024` when Sq ≠ Sk),
/// then ` causal` when masked.
pub fn label(p: &AttentionParams) -> String {
    let heads = if p.heads_q == p.heads_kv {
        p.heads_q.to_string()
    } else {
        format!("{}/{}", p.heads_q, p.heads_kv)
    };
    let seq = if p.seqlen_q == p.seqlen_k {
        p.seqlen_q.to_string()
    } else {
        format!("{}/{}", p.seqlen_q, p.seqlen_k)
    };
    format!(
        "b{} h{} s{} d{}{}",
        p.batch,
        heads,
        seq,
        p.head_dim,
        if p.causal { " causal" } else { "" }
    )
}
