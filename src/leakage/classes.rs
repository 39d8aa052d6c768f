//! The fixed input classes: corner cases of the 16-bit float formats (docs/design.md §5), each one a
//! pattern over Q, K and V; and, in secret-length mode, fixed true lengths. Pure functions of
//! the shape: GPU-free and unit-tested.

use crate::attention::DType;

/// A fixed class of input values. Every element of Q, K and V follows the pattern; a "row" is
/// one head-dim vector (the contiguous last dimension in both layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueClass {
    /// Every element +0.0.
    Zeros,
    /// ±max finite, the sign alternating along the row.
    MaxFinite,
    /// ±smallest subnormal, the sign alternating along the row.
    Denormal,
    /// One 1.0 per row (at column row mod D), the rest +0.0.
    OneHot,
    /// Every element 1.0.
    AllEqual,
    /// Extreme dynamic range within each row: +max, +tiny, −max, −tiny, repeating (tiny: the
    /// smallest subnormal).
    Range,
    /// One fixed draw of the random class's distribution (uniform in [−1, 1)), the same in
    /// every slot: not a corner case but the harness's own check. It differs from the random
    /// class only in being fixed, so a "leak" here comes from the data's regularity across
    /// launches or from the harness, not from a corner case. Not in the default sweep.
    OneRandom,
}

impl ValueClass {
    pub const ALL: [ValueClass; 6] = [
        ValueClass::Zeros,
        ValueClass::MaxFinite,
        ValueClass::Denormal,
        ValueClass::OneHot,
        ValueClass::AllEqual,
        ValueClass::Range,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ValueClass::Zeros => "zeros",
            ValueClass::MaxFinite => "max",
            ValueClass::Denormal => "denormal",
            ValueClass::OneHot => "onehot",
            ValueClass::AllEqual => "equal",
            ValueClass::Range => "range",
            ValueClass::OneRandom => "one-random",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            ValueClass::Zeros => "all +0.0",
            ValueClass::MaxFinite => "±max finite, alternating sign",
            ValueClass::Denormal => "±smallest subnormal, alternating sign",
            ValueClass::OneHot => "one 1.0 per row, rest 0",
            ValueClass::AllEqual => "every element 1.0",
            ValueClass::Range => "±max finite and ±smallest subnormal within each row",
            ValueClass::OneRandom => "one fixed uniform draw in [−1, 1)",
        }
    }

    pub fn from_name(s: &str) -> Option<ValueClass> {
        ValueClass::ALL
            .into_iter()
            .chain([ValueClass::OneRandom])
            .find(|c| c.name() == s)
    }

    /// The element at flat index `i` of a tensor whose rows have `head_dim` elements, as bits.
    pub fn element(self, dtype: DType, head_dim: usize, i: usize) -> u16 {
        let (row, col) = (i / head_dim, i % head_dim);
        let max = max_finite_bits(dtype);
        let tiny = 0x0001; // smallest positive subnormal of both formats
        match self {
            ValueClass::Zeros => 0,
            ValueClass::MaxFinite => max | sign(col % 2 == 1),
            ValueClass::Denormal => tiny | sign(col % 2 == 1),
            ValueClass::OneHot => {
                if col == row % head_dim {
                    one_bits(dtype)
                } else {
                    0
                }
            }
            ValueClass::AllEqual => one_bits(dtype),
            ValueClass::Range => match col % 4 {
                0 => max,
                1 => tiny,
                2 => max | SIGN,
                _ => tiny | SIGN,
            },
            ValueClass::OneRandom => {
                // SplitMix64 of the index: a fixed, uniform-looking draw.
                let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                let f = ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
                match dtype {
                    DType::F16 => half::f16::from_f32(f).to_bits(),
                    DType::Bf16 => half::bf16::from_f32(f).to_bits(),
                }
            }
        }
    }

    /// `len` elements of the pattern.
    pub fn fill(self, dtype: DType, head_dim: usize, len: usize) -> Vec<u16> {
        (0..len).map(|i| self.element(dtype, head_dim, i)).collect()
    }
}

const SIGN: u16 = 0x8000;

fn sign(negative: bool) -> u16 {
    if negative {
        SIGN
    } else {
        0
    }
}

/// Bits of the largest finite value: f16 65504 (0x7BFF), bf16 ≈ 3.39e38 (0x7F7F).
pub fn max_finite_bits(dtype: DType) -> u16 {
    match dtype {
        DType::F16 => 0x7BFF,
        DType::Bf16 => 0x7F7F,
    }
}

/// Bits of 1.0.
pub fn one_bits(dtype: DType) -> u16 {
    match dtype {
        DType::F16 => 0x3C00,
        DType::Bf16 => 0x3F80,
    }
}

/// A fixed true length in secret-length mode (the random class draws lengths uniformly from
/// [0, S] per batch entry and per launch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LengthClass {
    /// Every sequence empty.
    Zero,
    /// One token.
    One,
    /// S / 2.
    Half,
    /// The padded length S.
    Full,
}

impl LengthClass {
    pub const ALL: [LengthClass; 4] = [
        LengthClass::Zero,
        LengthClass::One,
        LengthClass::Half,
        LengthClass::Full,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LengthClass::Zero => "len-0",
            LengthClass::One => "len-1",
            LengthClass::Half => "len-half",
            LengthClass::Full => "len-full",
        }
    }

    pub fn from_name(s: &str) -> Option<LengthClass> {
        LengthClass::ALL.into_iter().find(|c| c.name() == s)
    }

    /// The true length for padded length `s`.
    pub fn length(self, s: usize) -> i32 {
        let l = match self {
            LengthClass::Zero => 0,
            LengthClass::One => 1.min(s),
            LengthClass::Half => s / 2,
            LengthClass::Full => s,
        };
        l as i32
    }
}

/// The fixed class of one run: values, or (secret-length mode) a length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FixedClass {
    Values(ValueClass),
    Length(LengthClass),
}

impl FixedClass {
    pub fn name(self) -> &'static str {
        match self {
            FixedClass::Values(c) => c.name(),
            FixedClass::Length(c) => c.name(),
        }
    }

    /// Every fixed class of a mode, in the order a default run takes them.
    pub fn all(secret_len: bool) -> Vec<FixedClass> {
        if secret_len {
            LengthClass::ALL
                .into_iter()
                .map(FixedClass::Length)
                .collect()
        } else {
            ValueClass::ALL
                .into_iter()
                .map(FixedClass::Values)
                .collect()
        }
    }

    /// Parses a class name of the given mode; the error lists the valid names.
    pub fn parse(s: &str, secret_len: bool) -> Result<FixedClass, String> {
        let found = if secret_len {
            LengthClass::from_name(s).map(FixedClass::Length)
        } else {
            ValueClass::from_name(s).map(FixedClass::Values)
        };
        found.ok_or_else(|| {
            let names: Vec<&str> = FixedClass::all(secret_len)
                .iter()
                .map(|c| c.name())
                .collect();
            let mode = if secret_len {
                "secret-length mode"
            } else {
                "value mode"
            };
            let other: Vec<&str> = FixedClass::all(!secret_len)
                .iter()
                .map(|c| c.name())
                .collect();
            let hint = if other.contains(&s) {
                if secret_len {
                    " (a value class: drop --secret-len)".to_string()
                } else {
                    " (a length class: add --secret-len)".to_string()
                }
            } else {
                String::new()
            };
            let extra = if secret_len { "" } else { " (or one-random)" };
            format!(
                "unknown class `{s}` in {mode}{hint}; expected one of: {}{extra}",
                names.join(", ")
            )
        })
    }
}
