//! What one attention call is: shapes, dtype, layout, mask, scale. All of it is public
//! (DESIGN.md §1): it may shape the launch, never the tensors' values.

/// Element type of Q, K, V and O.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F16,
    Bf16,
}

impl DType {
    pub fn size(self) -> usize {
        2
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(format!("unknown dtype `{s}` (expected f16 or bf16)")),
        }
    }
}

/// Memory layout of Q, K, V and O. `Bshd` is flash-attn's (batch, seq, head, dim);
/// `Bhsd` is PyTorch SDPA's (batch, head, seq, dim). The last dim is always contiguous.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    #[default]
    Bshd,
    Bhsd,
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "bshd" => Ok(Layout::Bshd),
            "bhsd" => Ok(Layout::Bhsd),
            _ => Err(format!("unknown layout `{s}` (expected bshd or bhsd)")),
        }
    }
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Bshd => "bshd",
            Layout::Bhsd => "bhsd",
        }
    }

    /// Element strides (batch, seq, head) of a contiguous tensor with this layout; dim stride is 1.
    pub fn strides(self, seqlen: usize, heads: usize, head_dim: usize) -> [usize; 3] {
        match self {
            Layout::Bshd => [seqlen * heads * head_dim, heads * head_dim, head_dim],
            Layout::Bhsd => [heads * seqlen * head_dim, head_dim, seqlen * head_dim],
        }
    }

    /// Shape of a tensor in this layout.
    pub fn shape(self, batch: usize, seqlen: usize, heads: usize, head_dim: usize) -> [usize; 4] {
        match self {
            Layout::Bshd => [batch, seqlen, heads, head_dim],
            Layout::Bhsd => [batch, heads, seqlen, head_dim],
        }
    }
}

/// Parameters of one forward call. `scale: None` means 1/sqrt(head_dim).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AttentionParams {
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    pub dtype: DType,
    pub layout: Layout,
    pub causal: bool,
    pub scale: Option<f32>,
}

impl AttentionParams {
    /// Self-attention shape: Sq = Sk, Hq = Hkv, f16, bshd, non-causal, default scale.
    pub fn new(batch: usize, heads: usize, seqlen: usize, head_dim: usize) -> Self {
        AttentionParams {
            batch,
            seqlen_q: seqlen,
            seqlen_k: seqlen,
            heads_q: heads,
            heads_kv: heads,
            head_dim,
            dtype: DType::F16,
            layout: Layout::Bshd,
            causal: false,
            scale: None,
        }
    }
    pub fn seqlen_k(mut self, s: usize) -> Self {
        self.seqlen_k = s;
        self
    }
    pub fn dtype(mut self, d: DType) -> Self {
        self.dtype = d;
        self
    }
    pub fn layout(mut self, l: Layout) -> Self {
        self.layout = l;
        self
    }
    pub fn causal(mut self, c: bool) -> Self {
        self.causal = c;
        self
    }
    pub fn scale(mut self, s: f32) -> Self {
        self.scale = Some(s);
        self
    }

    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }
    pub fn q_len(&self) -> usize {
        self.batch * self.seqlen_q * self.heads_q * self.head_dim
    }
    pub fn kv_len(&self) -> usize {
        self.batch * self.seqlen_k * self.heads_kv * self.head_dim
    }
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads_q * self.seqlen_q
    }
    /// flash-attn's FLOP count: 4·B·H·Sq·Sk·D, halved for causal with Sq = Sk.
    pub fn flops(&self) -> f64 {
        let f = 4.0
            * (self.batch * self.heads_q) as f64
            * self.seqlen_q as f64
            * self.seqlen_k as f64
            * self.head_dim as f64;
        if self.causal && self.seqlen_q == self.seqlen_k {
            f / 2.0
        } else {
            f
        }
    }
}
