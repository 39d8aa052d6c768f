//! The shipped kernels as one whole: every variant the library can launch, forward and backward,
//! audited under its own declarations, and the gate CI holds them to. Joins the variant table
//! (`kernels`) with the audit (`audit`), which know nothing of each other.

use crate::audit::{audit_variant, audit_variant_per_kernel, KernelAudit};
use crate::error::Result;
use crate::kernels::backward::{shipped_bwd_variants, DKDV_SYMBOL, DQ_SYMBOL};
use crate::kernels::{shipped_variants, FORWARD_SYMBOL};

/// The kernels whose SASS must use the tensor cores (HGMMA): the forward kernel and the
/// backward's two GEMM kernels.
pub const GEMM_KERNELS: [&str; 3] = [FORWARD_SYMBOL, DKDV_SYMBOL, DQ_SYMBOL];

/// Audits every kernel variant the library ships (compiling through the cache as needed).
pub fn audit_shipped() -> Result<Vec<KernelAudit>> {
    let mut out = Vec::new();
    for v in shipped_variants() {
        // Decode variants with public KV-cache metadata declare its pointers (cache_seqlens,
        // the block table) in the forward kernel's parameter block; nothing else reads metadata.
        out.extend(audit_variant_per_kernel(
            &v.cubin()?,
            &v.name(),
            |kernel| v.declared(kernel),
        )?);
    }
    // The backward kernels: Q, K, V, O, dO and the LSE are read from device memory (secret); no
    // parameter is secret; the one-pass variants' turn counters are a public buffer.
    for v in shipped_bwd_variants() {
        out.extend(audit_variant(&v.cubin()?, &v.name(), &v.declared())?);
    }
    Ok(out)
}

/// Why `a` fails the gate for shipped kernels (empty: it passes): a finding, a spill, or a GEMM
/// kernel without HGMMA.
pub fn gate_failures(a: &KernelAudit) -> Vec<String> {
    a.gate_failures(&GEMM_KERNELS)
}
