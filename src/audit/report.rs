//! Rendering audits: a human-readable table and JSON.

use super::KernelAudit;
use std::fmt::Write;

fn opt(v: Option<u32>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "?".into())
}

/// `  at file:line` after an instruction, where the cubin has line info.
fn at(loc: &Option<super::srcloc::SrcLoc>) -> String {
    loc.as_ref()
        .map(|l| format!("  at {l}"))
        .unwrap_or_default()
}

/// Summary table, one row per kernel, then each declared public buffer, then every finding with
/// its taint chain.
pub fn render_table(audits: &[KernelAudit]) -> String {
    let mut s = String::new();
    let name_of = |a: &KernelAudit| match &a.variant {
        Some(v) => format!("{v}:{}", a.name),
        None => a.name.clone(),
    };
    let w = audits
        .iter()
        .map(|a| name_of(a).len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        s,
        "{:<w$}  {:>8}  {:>5}  {:>7}  {:>6}  {:>5}  {:>4}  {:>4}  {:>4}  {:>9}  {:>8}",
        "kernel",
        "findings",
        "regs",
        "smem",
        "spills",
        "hgmma",
        "tma",
        "ex2",
        "bar",
        "br pub",
        "br secret"
    );
    for a in audits {
        let r = &a.resources;
        let _ = writeln!(
            s,
            "{:<w$}  {:>8}  {:>5}  {:>7}  {:>6}  {:>5}  {:>4}  {:>4}  {:>4}  {:>9}  {:>8}",
            name_of(a),
            a.findings.len(),
            opt(r.registers),
            r.static_shared_bytes,
            r.spills,
            r.hgmma,
            r.tma,
            r.mufu_ex2,
            r.bar,
            r.branches_public,
            r.branches_secret
        );
    }
    for a in audits {
        for b in &a.public_buffers {
            let _ = writeln!(s, "{}: {}", name_of(a), super::public::describe(b));
        }
    }
    for a in audits {
        for f in &a.findings {
            let _ = writeln!(
                s,
                "\n{} /*{:04x}*/ {}{}\n  rule {} ({}): {}",
                name_of(a),
                f.offset,
                f.text,
                at(&f.source),
                f.rule_number,
                f.rule.name(),
                f.reason
            );
            if f.function != a.name {
                let _ = writeln!(s, "  in subroutine {}", f.function);
            }
            if !f.chain.is_empty() {
                let _ = writeln!(s, "  taint chain (source first):");
                for st in &f.chain {
                    let _ = writeln!(s, "    /*{:04x}*/ {}{}", st.offset, st.text, at(&st.source));
                }
            }
        }
    }
    let total: usize = audits.iter().map(|a| a.findings.len()).sum();
    let _ = writeln!(
        s,
        "\n{} kernel(s), {} finding(s){}",
        audits.len(),
        total,
        if total == 0 { ": data-oblivious" } else { "" }
    );
    s
}

/// The audits as pretty JSON (an array of kernel audits).
pub fn render_json(audits: &[KernelAudit]) -> String {
    serde_json::to_string_pretty(audits).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}
