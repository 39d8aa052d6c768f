//! Control-flow graph over basic blocks of one kernel section, interprocedural: `CALL` edges go to
//! the callee's entry and the callee's `RET`s go back to every instruction after a call to it.
//!
//! Edges: `BRA` (taken target, plus fall-through when guarded or predicated), `BRX`/`BRXU`/
//! `JMX`/`JMXU`/`JMP` with a register target (indirect: every block of the function,
//! conservatively), `CALL.REL` (callee entry; a call through a register, `CALL.REL.NOINC R8`
//! or `CALL.ABS`: every function), `RET` (return sites), `EXIT`
//! and `KILL` (none, or fall-through when guarded), `BSSY` (fall-through: it only records the
//! reconvergence point, which its `BSYNC` falls through to), `BSYNC`/`BREAK`/`WARPSYNC`
//! (fall-through).

use super::sass::Section;

#[derive(Debug, Clone)]
pub struct Block {
    /// Instruction index range `[start, end)`.
    pub start: usize,
    pub end: usize,
    pub succs: Vec<usize>,
    pub preds: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Cfg {
    pub blocks: Vec<Block>,
    /// Block of each instruction.
    pub block_of: Vec<usize>,
    /// Indirect jumps/calls found (their targets were over-approximated).
    pub indirect: Vec<usize>,
}

/// Branch-like opcodes (end a basic block).
pub fn is_terminator(op: &str) -> bool {
    matches!(
        op,
        "BRA" | "BRX" | "BRXU" | "JMP" | "JMX" | "JMXU" | "CALL" | "RET" | "EXIT" | "KILL" | "BSSY"
    )
}

/// True when `BRA` is unconditional (no real guard and no predicate operand).
pub fn unconditional(insn: &super::sass::Insn) -> bool {
    let reg = |gpr: bool| {
        insn.operands.iter().any(|o| {
            o.as_reg()
                .is_some_and(|r| if gpr { r.reg.is_gpr() } else { r.reg.is_pred() })
        })
    };
    // `BRA.DIV UR4, ..` and other qualified branches may fall through.
    let qualified_bra = insn.op() == "BRA" && (reg(true) || insn.mods().any(|m| m != "U"));
    insn.real_guard().is_none() && !reg(false) && !qualified_bra
}

/// The callee of a direct `CALL` (a label and no register target). `CALL.REL.NOINC R8 `(k)`
/// calls through R8 (the label is only the base of the relative address): indirect.
pub fn direct_callee(insn: &super::sass::Insn) -> Option<&str> {
    let through_reg = insn
        .operands
        .iter()
        .any(|o| o.as_reg().is_some_and(|r| r.reg.is_gpr()));
    if through_reg {
        None
    } else {
        insn.label_target()
    }
}

pub fn build(sec: &Section) -> Cfg {
    let n = sec.insns.len();
    let target = |name: &str| sec.labels.get(name).copied().filter(|&t| t < n);
    // Leaders.
    let mut leader = vec![false; n + 1];
    if n > 0 {
        leader[0] = true;
    }
    for (_, s) in &sec.functions {
        leader[*s] = true;
    }
    for (i, insn) in sec.insns.iter().enumerate() {
        if is_terminator(insn.op()) {
            leader[i + 1] = true;
        }
        if let Some(t) = insn.label_target().and_then(target) {
            leader[t] = true;
        }
    }
    for &t in sec.labels.values() {
        if t < n {
            leader[t] = true;
        }
    }
    let mut blocks = Vec::new();
    let mut block_of = vec![0; n];
    let mut start = 0;
    for (i, &lead) in leader.iter().enumerate().skip(1) {
        if lead || i == n {
            if start < i {
                for b in block_of.iter_mut().take(i).skip(start) {
                    *b = blocks.len();
                }
                blocks.push(Block {
                    start,
                    end: i,
                    succs: vec![],
                    preds: vec![],
                });
            }
            start = i;
        }
    }
    // Return sites per function (index after each call to it).
    let nf = sec.functions.len();
    let mut return_sites: Vec<Vec<usize>> = vec![vec![]; nf];
    let func_index = |name: &str| sec.functions.iter().position(|(f, _)| f == name);
    let mut indirect = Vec::new();
    for (i, insn) in sec.insns.iter().enumerate() {
        if insn.op() == "CALL" && i + 1 < n {
            match direct_callee(insn).and_then(func_index) {
                Some(f) => return_sites[f].push(i + 1),
                None => {
                    for rs in return_sites.iter_mut() {
                        rs.push(i + 1);
                    }
                }
            }
        }
    }
    let nb = blocks.len();
    for blk in blocks.iter_mut() {
        let last = blk.end - 1;
        let insn = &sec.insns[last];
        let fallthrough = (last + 1 < n).then(|| block_of[last + 1]);
        let f = sec.function_of(last);
        let func_blocks = || {
            let r = sec.function_range(f);
            let mut v: Vec<usize> = r.clone().filter(|&i| i < n).map(|i| block_of[i]).collect();
            v.dedup();
            v
        };
        let mut succs: Vec<usize> = Vec::new();
        let conditional = !unconditional(insn);
        match insn.op() {
            "BRA" => {
                match insn.label_target().and_then(target) {
                    Some(t) => succs.push(block_of[t]),
                    // A target the listing does not label: anywhere in the function.
                    None => {
                        indirect.push(last);
                        succs.extend(func_blocks());
                    }
                }
                if conditional {
                    succs.extend(fallthrough);
                }
            }
            "BRX" | "BRXU" | "JMX" | "JMXU" | "JMP" => {
                match insn.label_target().and_then(target) {
                    Some(t) if insn.op() == "JMP" => succs.push(block_of[t]),
                    _ => {
                        indirect.push(last);
                        succs.extend(func_blocks());
                    }
                }
                if conditional {
                    succs.extend(fallthrough);
                }
            }
            "CALL" => {
                match direct_callee(insn).and_then(func_index) {
                    Some(fi) => {
                        succs.push(block_of[sec.functions[fi].1]);
                        if conditional {
                            succs.extend(fallthrough);
                        }
                    }
                    None => {
                        // Through a register: any device function here (a kernel entry cannot
                        // be called); or code outside this section (`vprintf`, `malloc`), which
                        // returns to the next instruction.
                        indirect.push(last);
                        for (_, s) in sec.functions.iter().skip(1) {
                            if *s < n {
                                succs.push(block_of[*s]);
                            }
                        }
                        succs.extend(fallthrough);
                    }
                }
            }
            "RET" => {
                for &rs in &return_sites[f] {
                    succs.push(block_of[rs]);
                }
                if conditional {
                    succs.extend(fallthrough);
                }
            }
            "EXIT" | "KILL" => {
                if conditional {
                    succs.extend(fallthrough);
                }
            }
            // BSSY only records the reconvergence point (reached through BSYNC's fall-through);
            // it transfers no control, so no edge to its target.
            _ => succs.extend(fallthrough),
        }
        succs.sort_unstable();
        succs.dedup();
        blk.succs = succs;
    }
    for b in 0..nb {
        for s in blocks[b].succs.clone() {
            blocks[s].preds.push(b);
        }
    }
    Cfg {
        blocks,
        block_of,
        indirect,
    }
}
