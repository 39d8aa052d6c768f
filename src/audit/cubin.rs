//! What the cubin's ELF says about each kernel: the parameter table (ordinal → constant-bank
//! bytes), the register count and the static shared memory. Parsed directly from the ELF64
//! sections (`.nv.info`, `.nv.info.<kernel>`, `.nv.shared.<kernel>`, `.symtab`), so no
//! `cuobjdump` is needed.

use crate::error::{Error, Result};
use std::collections::HashMap;

/// One kernel parameter as `EIATTR_KPARAM_INFO` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Param {
    pub ordinal: usize,
    /// Byte offset within the parameter block.
    pub offset: u32,
    pub size: u32,
}

/// Per-kernel facts from the ELF.
#[derive(Debug, Clone, Default)]
pub struct KernelInfo {
    pub name: String,
    /// Parameters sorted by ordinal.
    pub params: Vec<Param>,
    /// Constant-bank-0 offset of the parameter block (0x210 on sm_90).
    pub param_base: u32,
    pub registers: Option<u32>,
    pub static_shared: u64,
    pub frame_size: Option<u32>,
}

impl KernelInfo {
    /// Constant-bank-0 byte range `[start, end)` of parameter `ordinal`.
    pub fn param_range(&self, ordinal: usize) -> Option<(u32, u32)> {
        self.params.iter().find(|p| p.ordinal == ordinal).map(|p| {
            (
                self.param_base + p.offset,
                self.param_base + p.offset + p.size,
            )
        })
    }
}

const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_REGCOUNT: u8 = 0x2f;

struct Sh {
    name: String,
    typ: u32,
    offset: usize,
    size: usize,
    link: u32,
}

fn bad(msg: &str) -> Error {
    Error::Other(format!("malformed cubin: {msg}"))
}

fn rd<const N: usize>(d: &[u8], at: usize) -> Result<[u8; N]> {
    d.get(at..at + N)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| bad("read past the end"))
}
fn u16_at(d: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(rd::<2>(d, at)?))
}
fn u32_at(d: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(rd::<4>(d, at)?))
}
fn u64_at(d: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(rd::<8>(d, at)?))
}

fn cstr(d: &[u8], at: usize) -> String {
    let s = d.get(at..).unwrap_or(&[]);
    let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

fn sections(d: &[u8]) -> Result<Vec<Sh>> {
    if d.len() < 64 || &d[..4] != b"\x7fELF" || d[4] != 2 {
        return Err(bad("not an ELF64 file"));
    }
    let shoff = u64_at(d, 0x28)? as usize;
    let shentsize = u16_at(d, 0x3a)? as usize;
    let shnum = u16_at(d, 0x3c)? as usize;
    let shstrndx = u16_at(d, 0x3e)? as usize;
    let mut raw = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let o = shoff + i * shentsize;
        raw.push((
            u32_at(d, o)?,
            u32_at(d, o + 4)?,
            u64_at(d, o + 0x18)? as usize,
            u64_at(d, o + 0x20)? as usize,
            u32_at(d, o + 0x28)?,
        ));
    }
    let strtab = raw
        .get(shstrndx)
        .map(|r| r.2)
        .ok_or_else(|| bad("no shstrtab"))?;
    Ok(raw
        .into_iter()
        .map(|(name, typ, offset, size, link)| Sh {
            name: cstr(d, strtab + name as usize),
            typ,
            offset,
            size,
            link,
        })
        .collect())
}

/// Iterates over `.nv.info` records: (attribute, payload).
fn nv_info_records(data: &[u8]) -> Vec<(u8, &[u8])> {
    let mut out = Vec::new();
    let mut o = 0;
    while o + 4 <= data.len() {
        let (fmt, attr) = (data[o], data[o + 1]);
        if fmt == 4 {
            let sz = u16::from_le_bytes([data[o + 2], data[o + 3]]) as usize;
            let end = (o + 4 + sz).min(data.len());
            out.push((attr, &data[o + 4..end]));
            o += 4 + sz;
        } else {
            out.push((attr, &data[o + 2..o + 4]));
            o += 4;
        }
    }
    out
}

/// Facts about every kernel in the cubin, by kernel name.
pub fn kernel_infos(d: &[u8]) -> Result<HashMap<String, KernelInfo>> {
    let shs = sections(d)?;
    // Symbol names by index (for .nv.info's per-function attributes).
    let mut sym_names: Vec<String> = Vec::new();
    if let Some(symtab) = shs.iter().find(|s| s.typ == 2) {
        let strtab = shs
            .get(symtab.link as usize)
            .ok_or_else(|| bad("symtab without strtab"))?;
        let n = symtab.size / 24;
        for i in 0..n {
            let o = symtab.offset + i * 24;
            let name = u32_at(d, o)? as usize;
            sym_names.push(cstr(d, strtab.offset + name));
        }
    }
    let mut out: HashMap<String, KernelInfo> = HashMap::new();
    let slice = |s: &Sh| d.get(s.offset..s.offset + s.size).unwrap_or(&[]);
    for s in &shs {
        if let Some(k) = s.name.strip_prefix(".nv.info.") {
            let mut info = KernelInfo {
                name: k.to_string(),
                param_base: 0x210,
                ..Default::default()
            };
            for (attr, p) in nv_info_records(slice(s)) {
                match attr {
                    EIATTR_KPARAM_INFO if p.len() >= 12 => {
                        let ordinal = u16_at(p, 4)? as usize;
                        let offset = u16_at(p, 6)? as u32;
                        let size = u32_at(p, 8)? >> 18;
                        info.params.push(Param {
                            ordinal,
                            offset,
                            size,
                        });
                    }
                    EIATTR_PARAM_CBANK if p.len() >= 8 => {
                        info.param_base = u16_at(p, 4)? as u32;
                    }
                    _ => {}
                }
            }
            info.params.sort_by_key(|p| p.ordinal);
            out.insert(k.to_string(), info);
        }
    }
    for s in &shs {
        if s.name == ".nv.info" {
            for (attr, p) in nv_info_records(slice(s)) {
                if (attr == EIATTR_REGCOUNT || attr == EIATTR_FRAME_SIZE) && p.len() >= 8 {
                    let sym = u32_at(p, 0)? as usize;
                    let val = u32_at(p, 4)?;
                    if let Some(info) = sym_names.get(sym).and_then(|n| out.get_mut(n)) {
                        if attr == EIATTR_REGCOUNT {
                            info.registers = Some(val);
                        } else {
                            info.frame_size = Some(val);
                        }
                    }
                }
            }
        } else if let Some(k) = s.name.strip_prefix(".nv.shared.") {
            if let Some(info) = out.get_mut(k) {
                info.static_shared = s.size as u64;
            }
        }
    }
    Ok(out)
}
