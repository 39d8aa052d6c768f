//! Public buffers, the caller's side (docs/design.md §1, "Metadata"): which kernel-parameter bytes
//! are pointers to buffers whose contents are public — a paged KV cache's block table,
//! `cache_seqlens`, `cu_seqlens`. Parsing `--public-param`, checking declared byte ranges
//! against the kernel's parameter layout, and the per-kernel report of what the audit made of
//! each buffer. The analysis itself is [`super::provenance`].

use super::cubin::KernelInfo;
use super::provenance::{Provenance, Slots, MAX_BUFFERS};
use super::sass::Section;
use super::signature::ParamSpec;
use crate::error::{Error, Result};

/// A `--public-param`: a pointer parameter (0-based ordinal or name), or with `:OFFSET` the
/// 8-byte pointer field at byte OFFSET inside a struct parameter (as `offsetof` gives it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicSpec {
    pub param: ParamSpec,
    pub field: Option<u32>,
}

fn parse_offset(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) if !h.is_empty() => u32::from_str_radix(h, 16).ok(),
        Some(_) => None,
        None if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        None => None,
    }
}

impl std::str::FromStr for PublicSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (p, field) = match s.split_once(':') {
            None => (s, None),
            Some((p, off)) => match parse_offset(off) {
                Some(o) => (p, Some(o)),
                None => {
                    return Err(format!(
                        "`{off}` in `{s}` is not a byte offset (decimal or 0x hex): give \
                         PARAM:OFFSET, the offset of an 8-byte pointer field inside the parameter"
                    ))
                }
            },
        };
        Ok(PublicSpec {
            param: p.parse()?,
            field,
        })
    }
}

impl std::fmt::Display for PublicSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.field {
            None => write!(f, "{}", self.param),
            Some(o) => write!(f, "{}:{o:#x}", self.param),
        }
    }
}

/// The constant-bank-0 bytes of the pointer that `--public-param` names in parameter `ordinal`
/// of `kernel`: the whole parameter (which must be 8 bytes), or the 8-byte field at
/// `spec.field`.
pub fn field_range(
    kernel: &str,
    info: Option<&KernelInfo>,
    spec: &PublicSpec,
    ordinal: usize,
) -> Result<(u32, u32)> {
    pointer_range(kernel, info, ordinal, spec.field)
        .map_err(|m| Error::Other(format!("--public-param {spec}: {m}")))
}

/// The constant-bank-0 bytes of a pointer parameter (`field` `None`: it must be 8 bytes) or of
/// the 8-byte pointer field at byte `field` of a struct parameter, in `kernel`'s parameter
/// layout (a struct aligned to 64 bytes starts at `c[0x0][0x240]`, not `0x210`).
pub fn pointer_range(
    kernel: &str,
    info: Option<&KernelInfo>,
    ordinal: usize,
    field: Option<u32>,
) -> std::result::Result<(u32, u32), String> {
    let Some(info) = info else {
        return Err(format!(
            "kernel `{kernel}` has no parameter layout (an nvdisasm listing records none); audit the cubin"
        ));
    };
    let Some((start, end)) = info.param_range(ordinal) else {
        return Err(format!(
            "kernel `{kernel}` has no parameter #{ordinal} (ordinals are 0-based; it has {})",
            info.params.len()
        ));
    };
    let size = end - start;
    match field {
        None if size == 8 => Ok((start, end)),
        None => Err(format!(
            "parameter #{ordinal} of `{kernel}` has {size} bytes, not a pointer's 8; for a pointer \
             field inside a struct parameter give its byte offset, PARAM:OFFSET"
        )),
        Some(off) if off % 8 == 0 && off.checked_add(8).is_some_and(|e| e <= size) => {
            Ok((start + off, start + off + 8))
        }
        Some(off) => Err(format!(
            "a pointer field is 8 bytes at an 8-byte-aligned offset inside the parameter; \
             parameter #{ordinal} of `{kernel}` has {size} bytes, and {off:#x} is not such an offset"
        )),
    }
}

/// Checks the declared public-buffer ranges of `kernel` (constant-bank-0 `[start, end)`, one
/// 8-byte, 8-byte-aligned pointer each, inside one parameter, overlapping no secret range) and
/// returns them as the analysis's slots.
pub fn check_ranges(
    kernel: &str,
    info: Option<&KernelInfo>,
    secret: &[(u32, u32)],
    ranges: &[(u32, u32)],
) -> Result<Slots> {
    let mut starts: Vec<u32> = Vec::new();
    for &(s, e) in ranges {
        let what = format!("kernel `{kernel}`: public buffer bytes [{s:#x}, {e:#x})");
        let Some(info) = info else {
            return Err(Error::Other(format!(
                "{what}: no parameter layout to check them against (an nvdisasm listing records none); audit the cubin"
            )));
        };
        if e.checked_sub(s) != Some(8) || s % 8 != 0 {
            return Err(Error::Other(format!(
                "{what}: a public buffer is named by its pointer, 8 bytes at an 8-byte-aligned offset"
            )));
        }
        let inside = info
            .params
            .iter()
            .filter_map(|p| info.param_range(p.ordinal))
            .any(|(a, b)| a <= s && e <= b);
        if !inside {
            return Err(Error::Other(format!(
                "{what}: not inside one parameter (it has {} parameter(s) at {})",
                info.params.len(),
                info.params
                    .iter()
                    .filter_map(|p| info.param_range(p.ordinal))
                    .map(|(a, b)| format!("[{a:#x}, {b:#x})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if let Some(&(a, b)) = secret.iter().find(|&&(a, b)| s < b && a < e) {
            return Err(Error::Other(format!(
                "{what}: declared both public and secret (the secret parameter's bytes [{a:#x}, {b:#x}))"
            )));
        }
        if !starts.contains(&s) {
            starts.push(s);
        }
    }
    if starts.len() > MAX_BUFFERS {
        return Err(Error::Other(format!(
            "kernel `{kernel}`: {} public buffers declared; the audit takes at most {MAX_BUFFERS}",
            starts.len()
        )));
    }
    starts.sort_unstable();
    Ok(Slots { starts })
}

/// What the audit made of one public buffer of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PublicBuffer {
    /// Constant-bank-0 bytes `[start, end)` of its pointer.
    pub start: u32,
    pub end: u32,
    /// The parameter holding the pointer, and the pointer's byte offset inside it (0 for a
    /// pointer parameter).
    pub param: Option<usize>,
    pub field_offset: u32,
    /// Offsets of the reads proven to read it at a public address: their values are public.
    pub public_loads: Vec<u32>,
    /// Offsets of reads proven to be based on its pointer whose address or guard is secret: a
    /// rule-2 finding each, and their values are secret.
    pub secret_address_loads: Vec<u32>,
    /// Offsets of reads that may read it but whose values stay secret: their address may
    /// derive from its pointer without being proven to be based on it (a mixed join, an
    /// unknown derivation), or the buffer is written.
    pub unproven_loads: Vec<u32>,
    /// Offsets of instructions that may write through its pointer. When there is any and one
    /// of them may store a secret (or at a secret address), the buffer is not metadata: every
    /// read of it is secret (listed in `unproven_loads`).
    pub writes: Vec<u32>,
    /// Every write of it stores public values at public addresses (a turn counter the kernel's
    /// CTAs increment and poll): its reads stay public.
    pub public_writes: bool,
}

/// The per-buffer report of a provenance analysis; `secret_address(i)` tells whether read `i`
/// has a secret address or guard (a rule-2 finding).
pub fn report(
    sec: &Section,
    info: Option<&KernelInfo>,
    slots: &Slots,
    prov: &Provenance,
    secret_address: impl Fn(usize) -> bool,
) -> Vec<PublicBuffer> {
    let off = |v: &[usize]| -> Vec<u32> { v.iter().map(|&i| sec.insns[i].offset).collect() };
    slots
        .starts
        .iter()
        .enumerate()
        .map(|(x, &s)| {
            let param = info.and_then(|i| {
                i.params
                    .iter()
                    .filter_map(|p| i.param_range(p.ordinal).map(|r| (p.ordinal, r)))
                    .find(|&(_, (a, b))| a <= s && s < b)
            });
            let based: Vec<usize> = prov
                .reads
                .iter()
                .enumerate()
                .filter(|(_, r)| **r == Some(x as u8))
                .map(|(i, _)| i)
                .collect();
            let (secret, public): (Vec<usize>, Vec<usize>) =
                based.into_iter().partition(|&i| secret_address(i));
            let mut unproven = prov.unproven[x].clone();
            let written = !prov.readable(x);
            if written {
                unproven.extend(&public);
                unproven.sort_unstable();
            }
            PublicBuffer {
                start: s,
                end: s + 8,
                param: param.map(|p| p.0),
                field_offset: param.map(|(_, (a, _))| s - a).unwrap_or(0),
                public_loads: if written { Vec::new() } else { off(&public) },
                secret_address_loads: off(&secret),
                unproven_loads: off(&unproven),
                writes: off(&prov.writes[x]),
                public_writes: !prov.writes[x].is_empty() && prov.writes_public[x],
            }
        })
        .collect()
}

/// One line per public buffer for the human-readable report.
pub fn describe(b: &PublicBuffer) -> String {
    let list = |v: &[u32]| {
        v.iter()
            .map(|o| format!("/*{o:04x}*/"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let param = match b.param {
        Some(p) if b.field_offset == 0 => format!("parameter #{p}"),
        Some(p) => format!("parameter #{p} + {:#x}", b.field_offset),
        None => "no parameter".into(),
    };
    let mut s = format!(
        "public buffer c[0x0][{:#x}..{:#x}] ({param}): {} public load(s)",
        b.start,
        b.end,
        b.public_loads.len()
    );
    if !b.public_loads.is_empty() {
        s += &format!(" {}", list(&b.public_loads));
    }
    if !b.secret_address_loads.is_empty() {
        s += &format!(
            "; {} load(s) at a secret address, secret: {}",
            b.secret_address_loads.len(),
            list(&b.secret_address_loads)
        );
    }
    if !b.unproven_loads.is_empty() {
        s += &format!(
            "; {} load(s) not proven to read it, secret: {}",
            b.unproven_loads.len(),
            list(&b.unproven_loads)
        );
    }
    if b.public_writes {
        s += &format!(
            "; written through it at {}, only public values at public addresses: its reads stay public",
            list(&b.writes)
        );
    } else if !b.writes.is_empty() {
        s += &format!(
            "; written through it at {}, a secret value or address among them: every read of it is secret",
            list(&b.writes)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::cubin::Param;
    use super::*;

    fn info() -> KernelInfo {
        KernelInfo {
            name: "k".into(),
            params: vec![
                Param {
                    ordinal: 0,
                    offset: 0,
                    size: 8,
                },
                Param {
                    ordinal: 1,
                    offset: 8,
                    size: 4,
                },
                Param {
                    ordinal: 2,
                    offset: 16,
                    size: 40,
                },
            ],
            param_base: 0x210,
            ..Default::default()
        }
    }

    #[test]
    fn specs_parse() {
        let p = |s: &str| s.parse::<PublicSpec>();
        assert_eq!(
            p("bt"),
            Ok(PublicSpec {
                param: ParamSpec::Name("bt".into()),
                field: None
            })
        );
        assert_eq!(
            p("2:0x10"),
            Ok(PublicSpec {
                param: ParamSpec::Ordinal(2),
                field: Some(16)
            })
        );
        assert_eq!(p("p:24").unwrap().field, Some(24));
        for bad in ["", "p:", "p:0x", "p:zz", "p:-8", "a b", "p:8:8", ":8"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert_eq!(p("p:16").unwrap().to_string(), "p:0x10");
    }

    #[test]
    fn fields_resolve_to_pointer_bytes() {
        let i = info();
        let spec = |f: Option<u32>| PublicSpec {
            param: ParamSpec::Ordinal(0),
            field: f,
        };
        assert_eq!(
            field_range("k", Some(&i), &spec(None), 0).unwrap(),
            (0x210, 0x218)
        );
        assert_eq!(
            field_range("k", Some(&i), &spec(Some(8)), 2).unwrap(),
            (0x228, 0x230)
        );
        for (ord, f, needle) in [
            (1, None, "has 4 bytes, not a pointer's 8"),
            (2, None, "has 40 bytes"),
            (2, Some(4), "8-byte-aligned"),
            (2, Some(40), "8-byte-aligned"),
            (2, Some(u32::MAX - 3), "8-byte-aligned"),
            (3, None, "no parameter #3"),
        ] {
            let e = field_range("k", Some(&i), &spec(f), ord)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{ord} {f:?}: {e}");
        }
        let e = field_range("k", None, &spec(None), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no parameter layout"), "{e}");
    }

    #[test]
    fn ranges_are_checked() {
        let i = info();
        let ok = check_ranges(
            "k",
            Some(&i),
            &[],
            &[(0x230, 0x238), (0x210, 0x218), (0x210, 0x218)],
        );
        assert_eq!(ok.unwrap().starts, vec![0x210, 0x230]);
        for (r, secret, needle) in [
            ((0x210, 0x214), vec![], "8 bytes at an 8-byte-aligned"),
            ((0x214, 0x21c), vec![], "8 bytes at an 8-byte-aligned"),
            ((0x218, 0x220), vec![], "not inside one parameter"),
            ((0x400, 0x408), vec![], "not inside one parameter"),
            ((0x210, 0x208), vec![], "8 bytes"),
            (
                (0x230, 0x238),
                vec![(0x220, 0x248)],
                "both public and secret",
            ),
        ] {
            let e = check_ranges("k", Some(&i), &secret, &[r])
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{r:?}: {e}");
        }
        let e = check_ranges("k", None, &[], &[(0x210, 0x218)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no parameter layout"), "{e}");
        assert!(check_ranges("k", None, &[], &[]).unwrap().starts.is_empty());
        let many: Vec<(u32, u32)> = (0..65).map(|k| (0x238 + 8 * k, 0x240 + 8 * k)).collect();
        let mut big = info();
        big.params[2].size = 8 * 80;
        let e = check_ranges("k", Some(&big), &[], &many)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 64"), "{e}");
    }
}
