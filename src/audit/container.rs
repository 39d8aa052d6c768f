//! What `audit --cubin` accepts: a cubin itself (a CUDA ELF, as `nvcc -cubin` or NVRTC writes
//! it), or anything nvcc wraps cubins in — a fat binary (`nvcc -fatbin`), a host object
//! (`nvcc -c`), an executable or a shared library. Cubins are taken out of wrappers with
//! `cuobjdump -xelf all` (from the same pinned tools as nvdisasm), which also undoes fatbin
//! compression.

use crate::error::{Error, Result};
use std::path::Path;

/// One cubin with the SASS architecture it was built for (`sm_90a`).
#[derive(Debug, Clone)]
pub struct Cubin {
    pub arch: String,
    pub bytes: Vec<u8>,
}

const EM_CUDA: u16 = 190;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// Whether `d` is a CUDA ELF (a cubin), judged by its ELF header's machine field.
pub fn is_cubin(d: &[u8]) -> bool {
    d.len() >= 64 && &d[..4] == b"\x7fELF" && u16::from_le_bytes([d[0x12], d[0x13]]) == EM_CUDA
}

/// The SASS architecture of a cubin, from the `sm_` number in its ELF flags (bits 8..16 on
/// current toolkits; the `a` suffix is not recorded there the same way everywhere, so the
/// name cuobjdump gives is preferred where there is one).
fn arch_of_elf(d: &[u8]) -> Option<String> {
    let flags = u32::from_le_bytes(d.get(0x30..0x34)?.try_into().ok()?);
    let sm = (flags >> 8) & 0xff;
    (sm >= 20).then(|| format!("sm_{sm}"))
}

/// `name.sm_90a.cubin` → `sm_90a`.
fn arch_of_name(name: &str) -> Option<String> {
    let stem = name.strip_suffix(".cubin")?;
    let arch = stem.rsplit('.').next()?;
    arch.starts_with("sm_").then(|| arch.to_string())
}

/// Every cubin in the file's bytes, in the order the wrapper holds them.
pub fn cubins(path: &Path, bytes: &[u8]) -> Result<Vec<Cubin>> {
    if is_cubin(bytes) {
        let arch = arch_of_elf(bytes).unwrap_or_else(|| "sm_?".into());
        return Ok(vec![Cubin {
            arch,
            bytes: bytes.to_vec(),
        }]);
    }
    let is_elf = bytes.len() >= 4 && &bytes[..4] == b"\x7fELF";
    let is_fatbin = bytes.len() >= 4
        && u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) == FATBIN_MAGIC;
    if !is_elf && !is_fatbin {
        return Err(Error::Other(format!(
            "{} is neither a cubin, a fat binary nor an ELF object/executable with device code; build one with `nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -lineinfo FILE.cu`",
            path.display()
        )));
    }
    let extracted = extract(bytes)?;
    if extracted.is_empty() {
        return Err(Error::Other(format!(
            "{} holds no cubin (no device code, or only PTX); build with a real SASS target, e.g. `-gencode=arch=compute_90a,code=sm_90a`",
            path.display()
        )));
    }
    Ok(extracted)
}

/// Runs `cuobjdump -xelf all` on a private copy of the bytes in a fresh folder and reads back
/// the cubins it writes there (under the tools' time limit, [`crate::jit::toolkit::run_tool`]).
fn extract(bytes: &[u8]) -> Result<Vec<Cubin>> {
    let tool = crate::jit::toolkit::tool("cuobjdump")?;
    let dir = tempfile::tempdir().map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let input = dir.path().join("input.bin");
    std::fs::write(&input, bytes).map_err(|e| Error::io(&input, e))?;
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).map_err(|e| Error::io(&out_dir, e))?;
    // Under a wall-clock limit, like nvdisasm: a malformed wrapper must not hang the audit.
    let out = crate::jit::toolkit::run_tool(
        "cuobjdump",
        &tool,
        std::process::Command::new(&tool)
            .args(["-xelf", "all"])
            .arg(&input)
            .current_dir(&out_dir),
    )?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if text.contains("does not contain device code") {
        return Ok(Vec::new());
    }
    if !out.status.success() {
        return Err(Error::ToolFailed {
            tool: tool.display().to_string(),
            message: text.trim().to_string(),
        });
    }
    let mut names: Vec<String> = std::fs::read_dir(&out_dir)
        .map_err(|e| Error::io(&out_dir, e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".cubin"))
        .collect();
    // cuobjdump numbers nothing in the names; keep the order it printed them in.
    names.sort_by_key(|n| text.find(n.as_str()).unwrap_or(usize::MAX));
    let mut v = Vec::new();
    for n in names {
        let p = out_dir.join(&n);
        let b = std::fs::read(&p).map_err(|e| Error::io(&p, e))?;
        if !is_cubin(&b) {
            continue;
        }
        let arch = arch_of_name(&n)
            .or_else(|| arch_of_elf(&b))
            .unwrap_or_else(|| "sm_?".into());
        v.push(Cubin { arch, bytes: b });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_from_names() {
        assert_eq!(arch_of_name("k.sm_90a.cubin").as_deref(), Some("sm_90a"));
        assert_eq!(arch_of_name("a.b.sm_80.cubin").as_deref(), Some("sm_80"));
        assert_eq!(arch_of_name("k.cubin"), None);
        assert_eq!(arch_of_name("k.ptx"), None);
    }

    #[test]
    fn non_containers_are_refused_with_the_nvcc_line() {
        let e = cubins(Path::new("x.txt"), b"hello")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("neither a cubin") && e.contains("nvcc -cubin"),
            "{e}"
        );
        assert!(!is_cubin(b"\x7fELF"));
    }
}
