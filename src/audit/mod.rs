//! `flashcore audit`: static taint analysis over the SASS of every kernel (docs/design.md §5).
//!
//! Pipeline: cubin → `nvdisasm -c` → [`sass`] instructions → [`cfg`] basic blocks →
//! ([`provenance`] of public-buffer pointers, where any are declared) → [`taint`] fixed point →
//! [`rules`] findings, plus a per-kernel [`Resources`] report read from the instructions and the
//! ELF ([`cubin`]).

pub mod bits;
pub mod cfg;
pub mod container;
pub mod cubin;
pub mod effects;
pub mod loc;
pub mod provenance;
pub mod public;
pub mod report;
pub mod roles;
pub mod rules;
pub mod sass;
pub mod select;
pub mod signature;
pub mod source;
pub mod srcloc;
pub mod table;
pub mod taint;

pub use public::{PublicBuffer, PublicSpec};
pub use select::{ParamSpec, Picked, Selection};

pub use rules::{Finding, Rule, Step};

use crate::error::{Error, Result};
use std::path::Path;

/// Resource usage of one kernel.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Resources {
    pub instructions: usize,
    /// Registers per thread (EIATTR_REGCOUNT).
    pub registers: Option<u32>,
    /// Static shared memory in bytes (`.nv.shared.<kernel>`).
    pub static_shared_bytes: u64,
    /// Spill instructions (LDL + STL).
    pub spills: usize,
    pub ldl: usize,
    pub stl: usize,
    pub hgmma: usize,
    /// UTMALDG + UBLKCP + UTMASTG.
    pub tma: usize,
    pub mufu_ex2: usize,
    pub bar: usize,
    /// mbarrier try-wait instructions (`SYNCS.PHASECHK...TRYWAIT`), whose result is public.
    pub mbarrier_waits: usize,
    /// Conditional control transfers (guarded or predicated BRA/EXIT/RET/BRX/...) on public
    /// predicates and on secret ones.
    pub branches_public: usize,
    pub branches_secret: usize,
    /// Calls to compiler slow-path routines (IEEE div/sqrt, 64-bit division).
    pub slow_path_calls: usize,
}

/// The audit of one kernel.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelAudit {
    /// Kernel symbol.
    pub name: String,
    /// Shipped variant name (`fwd_f16_d64_full`) when audited as part of a variant
    /// (`shipped::audit_shipped`).
    pub variant: Option<String>,
    pub secret_params: Vec<usize>,
    /// The declared public buffers (block tables, sequence lengths) and what the audit made of
    /// each: which loads read them as public, which could not be proven to.
    pub public_buffers: Vec<PublicBuffer>,
    pub params: Vec<cubin::Param>,
    pub findings: Vec<Finding>,
    pub resources: Resources,
    /// Version of the rule table the audit ran with ([`table::VERSION`]).
    pub rule_table: &'static str,
}

impl KernelAudit {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
    /// The CI gate for shipped kernels: no finding, no spill, and each kernel named in
    /// `gemm_kernels` (the library's: `shipped::GEMM_KERNELS`) uses HGMMA.
    pub fn gate_failures(&self, gemm_kernels: &[&str]) -> Vec<String> {
        let mut v = Vec::new();
        if !self.findings.is_empty() {
            v.push(format!("{} finding(s)", self.findings.len()));
        }
        if self.resources.spills > 0 {
            v.push(format!(
                "{} spill instruction(s) (LDL {}, STL {})",
                self.resources.spills, self.resources.ldl, self.resources.stl
            ));
        }
        if gemm_kernels.contains(&self.name.as_str()) && self.resources.hgmma == 0 {
            v.push("GEMM kernel without HGMMA (wgmma)".into());
        }
        v
    }
}

/// Runs `nvdisasm -c` on a cubin and returns the listing; a run past
/// [`crate::jit::toolkit::tool_timeout`] is killed and answered with [`Error::ToolTimeout`].
pub fn disassemble(cubin: &[u8]) -> Result<String> {
    let tool = crate::jit::toolkit::tool("nvdisasm")?;
    let dir = std::env::temp_dir();
    let path = dir.join(format!(
        "flashcore-audit-{}-{}.cubin",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::write(&path, cubin).map_err(|e| Error::io(&path, e))?;
    // `-gi`: line info with inlining (a comment before each source line's instructions) where
    // the cubin was built with `-lineinfo`; nothing changes for a cubin without it.
    // Under a wall-clock limit: a malformed cubin can make nvdisasm loop forever.
    let out = crate::jit::toolkit::run_tool(
        "nvdisasm",
        &tool,
        std::process::Command::new(&tool)
            .arg("-c")
            .arg("-gi")
            .arg(&path),
    );
    let _ = std::fs::remove_file(&path);
    let out = out?;
    if !out.status.success() {
        return Err(Error::ToolFailed {
            tool: tool.display().to_string(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// What the caller declares about a kernel's parameters, beyond the default (everything read
/// from global memory is secret; parameter values are public).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    /// 0-based ordinals of the parameters whose values are secret.
    pub secret_params: Vec<usize>,
    /// Pointers to public buffers (docs/design.md §1, "Metadata": block tables, `cache_seqlens`,
    /// `cu_seqlens`): constant-bank-0 byte ranges `[start, end)`, 8 bytes each, a pointer
    /// parameter or a pointer field of a `__grid_constant__` struct. A global read proven to
    /// read one ([`provenance`]) is public instead of a taint source. Mind the parameter
    /// block's layout: a struct parameter aligned to 64 bytes (flashcore's `Params`, whose
    /// `TensorMap`s are) starts at `c[0x0][0x240]`, not `0x210`; [`Declared::public_fields`]
    /// does that arithmetic against the cubin.
    pub public_buffers: Vec<(u32, u32)>,
    /// The same, as `(parameter ordinal, byte offset of the 8-byte pointer field inside it)`
    /// (`std::mem::offset_of!` of the host-side mirror; `(n, 0)` for a pointer parameter),
    /// resolved against each kernel's parameter layout.
    pub public_fields: Vec<(usize, u32)>,
}

/// Audits one parsed kernel section with `secret_params` secret and no public buffer.
pub fn audit_section(
    sec: &sass::Section,
    info: Option<&cubin::KernelInfo>,
    secret_params: &[usize],
) -> Result<KernelAudit> {
    audit_section_with(
        sec,
        info,
        &Declared {
            secret_params: secret_params.to_vec(),
            ..Default::default()
        },
    )
}

/// Audits one parsed kernel section under what `decl` declares about its parameters.
pub fn audit_section_with(
    sec: &sass::Section,
    info: Option<&cubin::KernelInfo>,
    decl: &Declared,
) -> Result<KernelAudit> {
    if sec.insns.is_empty() {
        // A kernel with no instruction read would pass vacuously: refuse instead.
        return Err(Error::Other(format!(
            "kernel `{}`: no instruction could be read from its listing; the audit cannot judge it",
            sec.kernel
        )));
    }
    let mut secrets = taint::Secrets::default();
    for &p in &decl.secret_params {
        match info.and_then(|i| i.param_range(p)) {
            Some(r) => secrets.ranges.push(r),
            None => {
                return Err(Error::Other(format!(
                    "kernel `{}` has no parameter #{p} (--secret-param is 0-based; it has {})",
                    sec.kernel,
                    info.map(|i| i.params.len()).unwrap_or(0)
                )))
            }
        }
    }
    let mut ranges = decl.public_buffers.clone();
    for &(ordinal, field) in &decl.public_fields {
        let size = info
            .and_then(|i| i.param_range(ordinal))
            .map(|(a, b)| b - a);
        // A whole pointer parameter is field 0 of itself.
        let field = (size != Some(8) || field != 0).then_some(field);
        let r = public::pointer_range(&sec.kernel, info, ordinal, field).map_err(|m| {
            Error::Other(format!(
                "public field ({ordinal}, {:#x}): {m}",
                field.unwrap_or(0)
            ))
        })?;
        ranges.push(r);
    }
    let slots = public::check_ranges(&sec.kernel, info, &secrets.ranges, &ranges)?;
    let refused = |r: taint::Refused| {
        let insn = &sec.insns[r.index];
        Error::Other(format!(
            "kernel `{}` /*{:04x}*/ {}: {}; the audit cannot judge it",
            sec.kernel, insn.offset, insn.text, r.why
        ))
    };
    let g = cfg::build(sec);
    let mut prov = None;
    let an = if slots.starts.is_empty() {
        taint::analyze(sec, &g, &secrets).map_err(refused)?
    } else {
        let effects = taint::section_effects(sec, &secrets).map_err(refused)?;
        let mut p = provenance::analyze(sec, &g, &effects, &slots).map_err(refused)?;
        // A written buffer's reads are public only if every write of it is a public value at a
        // public address (a turn counter). Assume so, check each write against the taint
        // analysis that assumption gives, and demote the buffers with a secret write until
        // nothing changes (demoting only adds taint, so this ends).
        for x in 0..p.writes.len() {
            p.writes_public[x] = !p.writes[x].is_empty();
        }
        loop {
            secrets.public_reads = p.public_reads();
            let an = taint::analyze(sec, &g, &secrets).map_err(refused)?;
            let mut changed = false;
            for x in 0..p.writes.len() {
                if p.writes_public[x]
                    && p.writes[x]
                        .iter()
                        .any(|&i| rules::secret_operands(&g, &an, i))
                {
                    p.writes_public[x] = false;
                    changed = true;
                }
            }
            if !changed {
                prov = Some(p);
                break an;
            }
        }
    };
    let findings = rules::findings(sec, &g, &an);
    let public_buffers = match &prov {
        Some(p) => public::report(sec, info, &slots, p, |i| {
            findings
                .iter()
                .any(|f| f.offset == sec.insns[i].offset && f.rule == Rule::MemoryAddress)
        }),
        None => Vec::new(),
    };
    let resources = resources(sec, &g, &an, info, &findings);
    Ok(KernelAudit {
        name: sec.kernel.clone(),
        variant: None,
        secret_params: decl.secret_params.clone(),
        public_buffers,
        params: info.map(|i| i.params.clone()).unwrap_or_default(),
        findings,
        resources,
        rule_table: table::VERSION,
    })
}

fn resources(
    sec: &sass::Section,
    g: &cfg::Cfg,
    an: &taint::Analysis,
    info: Option<&cubin::KernelInfo>,
    findings: &[Finding],
) -> Resources {
    let mut r = Resources {
        instructions: sec.insns.len(),
        registers: info.and_then(|i| i.registers),
        static_shared_bytes: info.map(|i| i.static_shared).unwrap_or(0),
        ..Default::default()
    };
    let secret_offsets: std::collections::HashSet<u32> = findings
        .iter()
        .filter(|f| {
            matches!(
                f.text
                    .split_whitespace()
                    .find(|t| !t.starts_with('@'))
                    .map(|t| t.split('.').next().unwrap_or("")),
                Some(
                    "BRA"
                        | "BRX"
                        | "BRXU"
                        | "JMX"
                        | "JMXU"
                        | "JMP"
                        | "EXIT"
                        | "RET"
                        | "KILL"
                        | "CALL"
                )
            )
        })
        .map(|f| f.offset)
        .collect();
    for (i, insn) in sec.insns.iter().enumerate() {
        // Skip unreachable padding (the trailing `BRA self` after the last EXIT).
        if an.block_in[g.block_of[i]].is_none() {
            continue;
        }
        // Inside a compiler slow-path routine: its call site is what the report counts.
        let f = sec.function_of(i);
        if f != 0 && rules::is_slow_path(&sec.functions[f].0) {
            continue;
        }
        match insn.op() {
            "LDL" => r.ldl += 1,
            "STL" => r.stl += 1,
            "HGMMA" => r.hgmma += 1,
            "UTMALDG" | "UBLKCP" | "UTMASTG" => r.tma += 1,
            "MUFU" if insn.has_mod("EX2") => r.mufu_ex2 += 1,
            "BAR" => r.bar += 1,
            "SYNCS" if insn.has_mod("TRYWAIT") => r.mbarrier_waits += 1,
            "CALL"
                if insn
                    .label_target()
                    .map(rules::is_slow_path)
                    .unwrap_or(false) =>
            {
                r.slow_path_calls += 1
            }
            _ => {}
        }
        if matches!(
            insn.op(),
            "BRA" | "BRX" | "BRXU" | "JMX" | "JMXU" | "JMP" | "EXIT" | "RET" | "KILL" | "CALL"
        ) && !cfg::unconditional(insn)
        {
            if secret_offsets.contains(&insn.offset) {
                r.branches_secret += 1;
            } else {
                r.branches_public += 1;
            }
        }
    }
    r.spills = r.ldl + r.stl;
    r
}

/// The kernel sections of a cubin with their ELF facts.
type Kernels = Vec<(sass::Section, Option<cubin::KernelInfo>)>;

fn kernel_sections(cubin: &[u8]) -> Result<Kernels> {
    let mut infos = cubin::kernel_infos(cubin)?;
    let listing = disassemble(cubin)?;
    let any_info = !infos.is_empty();
    let mut out = Vec::new();
    for sec in sass::parse_listing(&listing) {
        // Only kernels (entry points have a .nv.info.<name> section); device functions that
        // got their own section are reached through CALL edges from a kernel's section only if
        // inlined there, so they are audited as part of the caller when present.
        let info = infos.remove(&sec.kernel);
        if info.is_none() && any_info {
            continue;
        }
        out.push((sec, info));
    }
    Ok(out)
}

/// Audits every kernel in a cubin; `secret_params` are 0-based parameter ordinals that are
/// secret in every kernel; no public buffer.
pub fn audit_cubin(cubin: &[u8], secret_params: &[usize]) -> Result<Vec<KernelAudit>> {
    audit_cubin_with(
        cubin,
        &Declared {
            secret_params: secret_params.to_vec(),
            ..Default::default()
        },
    )
}

/// Audits every kernel in a cubin under `decl` (the same declarations for every kernel).
pub fn audit_cubin_with(cubin: &[u8], decl: &Declared) -> Result<Vec<KernelAudit>> {
    let mut out = Vec::new();
    for (sec, info) in kernel_sections(cubin)? {
        out.push(audit_section_with(&sec, info.as_ref(), decl)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Audits the kernels of one shipped variant's cubin under `decl`, named `variant` in the
/// report: `secret_params` as the variant declares them (`Variant::secret_params`), and the variant's
/// pointers to public metadata as `public_buffers` (constant-bank-0 ranges) or `public_fields`
/// (`(0, offset_of!(KernelParams, block_table))`).
pub fn audit_variant(cubin: &[u8], variant: &str, decl: &Declared) -> Result<Vec<KernelAudit>> {
    audit_variant_per_kernel(cubin, variant, |_| decl.clone())
}

/// [`audit_variant`] with each kernel's own declaration (`decl_of(kernel name)`): a cubin whose
/// kernels take different parameter blocks (decode mode's main and combine kernels) declares
/// each one's metadata pointers against its own layout.
pub fn audit_variant_per_kernel(
    cubin: &[u8],
    variant: &str,
    decl_of: impl Fn(&str) -> Declared,
) -> Result<Vec<KernelAudit>> {
    let mut out = Vec::new();
    for (sec, info) in kernel_sections(cubin)? {
        let decl = decl_of(&sec.kernel);
        let mut k = audit_section_with(&sec, info.as_ref(), &decl)?;
        k.variant = Some(variant.to_string());
        out.push(k);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Audits the kernels of a cubin that `sel` picks, with the secret parameters and public
/// buffers it names.
pub fn audit_cubin_selected(cubin: &[u8], sel: &Selection) -> Result<Vec<KernelAudit>> {
    let kernels = kernel_sections(cubin)?;
    let picked = sel.pick(&kernels)?;
    let mut out = Vec::new();
    for p in picked {
        let (sec, info) = &kernels[p.index];
        let decl = Declared {
            secret_params: p.secret,
            public_buffers: p.public,
            ..Default::default()
        };
        out.push(audit_section_with(sec, info.as_ref(), &decl)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Audits a cubin, fat binary, object or executable (see [`container`]): every cubin in it, or
/// those for `arch`; with more than one, each audit names its architecture.
pub fn audit_binary(
    path: &Path,
    bytes: &[u8],
    arch: Option<&str>,
    sel: &Selection,
) -> Result<Vec<KernelAudit>> {
    let all = container::cubins(path, bytes)?;
    let cubins: Vec<&container::Cubin> = match arch {
        None => all.iter().collect(),
        Some(want) => all
            .iter()
            .filter(|c| select::arch_matches(want, &c.arch))
            .collect(),
    };
    if cubins.is_empty() {
        let have: Vec<&str> = all.iter().map(|c| c.arch.as_str()).collect();
        return Err(Error::Other(format!(
            "{} holds no cubin for {} (it has {})",
            path.display(),
            arch.unwrap_or("?"),
            have.join(", ")
        )));
    }
    let mut out = Vec::new();
    for c in &cubins {
        for mut k in audit_cubin_selected(&c.bytes, sel)? {
            if cubins.len() > 1 {
                k.variant = Some(c.arch.clone());
            }
            out.push(k);
        }
    }
    Ok(out)
}

/// Compiles a user's CUDA file with NVRTC ([`source::compile`]: toolkit headers, `-I`, `-D`,
/// `--std`, `--arch`, line info) and audits the kernels `sel` picks; parameter names for
/// `--secret-param` come from the file's `__global__` signatures.
pub fn audit_source(
    path: &Path,
    opts: &source::SourceOptions,
    sel: &Selection,
) -> Result<Vec<KernelAudit>> {
    let src = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let cubin = source::compile(path, &src, opts)?;
    let mut sel = sel.clone();
    if sel.signatures.is_none() {
        sel.signatures = Some(signature::parse_signatures(&src));
    }
    audit_cubin_selected(&cubin, &sel)
}

/// Audits every kernel section of an `nvdisasm -c` listing (SASS printed elsewhere, e.g. by
/// `cuobjdump -sass` of a fat binary). Without the cubin there is no parameter layout, so no
/// parameter can be declared secret; global memory is secret as always.
pub fn audit_listing(listing: &str) -> Result<Vec<KernelAudit>> {
    audit_listing_selected(listing, &Selection::default())
}

/// As [`audit_listing`], for the kernels `sel` picks (`sel` may not declare secrets).
pub fn audit_listing_selected(listing: &str, sel: &Selection) -> Result<Vec<KernelAudit>> {
    let kernels: Kernels = sass::parse_listing(listing)
        .into_iter()
        .map(|s| (s, None))
        .collect();
    let mut out = Vec::new();
    for p in sel.pick(&kernels)? {
        let decl = Declared {
            secret_params: p.secret,
            public_buffers: p.public,
            ..Default::default()
        };
        out.push(audit_section_with(&kernels[p.index].0, None, &decl)?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
