//! What one attention call is: shapes, dtype, layout, mask, scale. All of it is public
//! (docs/design.md §1): it may shape the launch, never the tensors' values.

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

/// A sliding window (flash-attn's `window_size`): query row `i`, bottom-right aligned to the keys
/// (`i' = i + Sk − Sq`), sees key `j` iff `i' − left ≤ j ≤ i' + right`; `None` is unbounded
/// (flash-attn's −1). Causal is `right = 0`: with `causal` set, `right` is taken as 0 whatever
/// it says (flash-attn's rule). Public: it shapes the key range each query tile walks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Window {
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl Window {
    /// No window: every key (causal: every key up to the diagonal).
    pub const UNBOUNDED: Window = Window {
        left: None,
        right: None,
    };

    /// From flash-attn's `(left, right)`, where −1 (any negative) is unbounded.
    pub fn from_flash_attn(left: i64, right: i64) -> Window {
        let side = |x: i64| if x < 0 { None } else { Some(x as usize) };
        Window {
            left: side(left),
            right: side(right),
        }
    }

    /// Back to flash-attn's `(left, right)` with −1 for unbounded.
    pub fn to_flash_attn(self) -> (i64, i64) {
        let side = |x: Option<usize>| x.map_or(-1, |v| v.min(i64::MAX as usize) as i64);
        (side(self.left), side(self.right))
    }

    pub fn is_unbounded(self) -> bool {
        self.left.is_none() && self.right.is_none()
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
    /// Sliding window ([`Window`]); unbounded by default.
    #[serde(default)]
    pub window: Window,
    /// Logit softcap: scores become `softcap · tanh(scale · q·k / softcap)` before the softmax
    /// (Gemma 2); 0 is off. Public.
    #[serde(default)]
    pub softcap: f32,
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
            window: Window::UNBOUNDED,
            softcap: 0.0,
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
    pub fn window(mut self, w: Window) -> Self {
        self.window = w;
        self
    }
    pub fn softcap(mut self, cap: f32) -> Self {
        self.softcap = cap;
        self
    }

    /// The window the kernels apply: `right` is 0 when causal.
    pub fn effective_window(&self) -> Window {
        Window {
            left: self.window.left,
            right: if self.causal {
                Some(0)
            } else {
                self.window.right
            },
        }
    }

    /// Whether query row `i` sees key `j` (window and causal mask, bottom-right aligned).
    pub fn sees(&self, i: usize, j: usize) -> bool {
        let w = self.effective_window();
        // Row i's aligned position i + Sk − Sq, in i128 so nothing overflows.
        let pos = i as i128 + self.seqlen_k as i128 - self.seqlen_q as i128;
        let j = j as i128;
        w.left.is_none_or(|l| j >= pos - l as i128) && w.right.is_none_or(|r| j <= pos + r as i128)
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
