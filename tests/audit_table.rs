//! The rule table, walked opcode by opcode: for every opcode and every operand form,
//! a synthetic instruction is built and
//! * taint is checked to flow from each source (register, predicate, carry-in, address register,
//!   guard) to each destination (register, predicate, carry-out), and into or out of the memory
//!   cell its class names (shared, local, barrier result; global loads are secret by themselves);
//! * the sinks of its class are checked to fire when one of its operands (or its guard) is
//!   secret, and an ALU instruction is checked to be no sink.
//!
//! Then the refusals: an opcode or an operand form the table does not know makes `flashcore
//! audit` exit 2 naming it, and `--json` carries the table's version. No CUDA tools needed.

mod common;
use common::flashcore;
use flashcore::audit::table::{self, Class, Space, TABLE};
use flashcore::audit::taint::{
    self, Analysis, Effects, Globals, State, BARRES, LMEM, NONE, P_BASE, SMEM,
};
use flashcore::audit::{cfg, rules, sass};

/// Modifiers that make a synthetic instruction of `op` well formed (a LUT op needs `.LUT`, a
/// wgmma a shape).
fn opcode_text(op: &str) -> Vec<String> {
    match op {
        "LOP3" | "ULOP3" | "PLOP3" | "UPLOP3" => vec![format!("{op}.LUT")],
        "HGMMA" | "IGMMA" | "QGMMA" | "BGMMA" => vec![format!("{op}.64x8x16.F32")],
        "BAR" => vec!["BAR.SYNC".into(), "BAR.RED.POPC".into()],
        "B2R" => vec!["B2R.RESULT".into()],
        "MUFU" => vec!["MUFU.EX2".into()],
        _ => vec![op.to_string()],
    }
}

/// One synthetic operand list for `form` (each `?`/`*` slot taken once), with distinct
/// registers: destinations R10.., P0..; sources R20.., P3..; addresses R40...
fn operands(form: &str) -> Vec<String> {
    let (mut d, mut q, mut s, mut b, mut m) = (10, 0, 20, 3, 40);
    form.split_whitespace()
        .map(|slot| {
            let t = match slot.as_bytes()[0] {
                b'd' => {
                    d += 1;
                    format!("R{}", d - 1)
                }
                b'q' => {
                    q += 1;
                    format!("P{}", q - 1)
                }
                b's' => {
                    s += 4;
                    format!("R{}", s - 4)
                }
                b'b' => {
                    b += 1;
                    format!("P{}", b - 1)
                }
                b'm' => {
                    m += 8;
                    format!("[R{}]", m - 8)
                }
                b'l' => "`(.L_x_1)".into(),
                b'x' => "B0".into(),
                b'R' => "PR".into(),
                c => panic!("slot {}", c as char),
            };
            t
        })
        .collect()
}

struct Synth {
    text: String,
    sec: sass::Section,
    effects: Vec<Effects>,
}

fn synth(opcode: &str, ops: &[String], guard: Option<&str>) -> Synth {
    let g = guard.map(|g| format!("@{g} ")).unwrap_or_default();
    let text = format!("{g}{opcode} {}", ops.join(", "));
    let listing = format!(
        "\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n\
         /*0000*/ {text} ;\n.L_x_1:\n/*0010*/ EXIT ;\n"
    );
    let sec = sass::parse_listing(&listing).remove(0);
    let effects = taint::section_effects(&sec, &taint::Secrets::default())
        .unwrap_or_else(|r| panic!("{text}: refused: {}", r.why));
    Synth { text, sec, effects }
}

fn secret(st: &mut State, l: usize) {
    st.t[l] = 0;
    st.m[l] = u32::MAX;
}

fn after(s: &Synth, st: &State) -> State {
    let mut st = st.clone();
    taint::transfer(0, &s.effects[0], &mut st, &Globals::default());
    st
}

/// Findings of the synthetic instruction (offset 0) with `st` as the state before it.
fn sink_findings(s: &Synth, st: State) -> Vec<rules::Finding> {
    let g = cfg::build(&s.sec);
    let mut block_in = vec![None; g.blocks.len()];
    block_in[g.block_of[0]] = Some(st);
    let an = Analysis {
        effects: s.effects.clone(),
        block_in,
        causes: vec![None; s.sec.insns.len()],
        globals: Globals::default(),
    };
    rules::findings(&s.sec, &g, &an)
        .into_iter()
        .filter(|f| f.offset == 0)
        .collect()
}

/// Locations named by memory operands (address, descriptor and coordinate registers).
fn address_locs(s: &Synth) -> Vec<usize> {
    let insn = &s.sec.insns[0];
    insn.operands
        .iter()
        .flat_map(|o| taint::mem_operand_locs(insn, o))
        .collect()
}

#[test]
fn every_opcode_every_form_moves_taint_from_each_source_to_each_destination() {
    let mut checked = 0;
    for rule in TABLE {
        for opcode in opcode_text(rule.op) {
            for form in rule.forms {
                let ops = operands(form);
                let s = synth(&opcode, &ops, None);
                let e = &s.effects[0];
                let what = format!("{} [{} / form `{form}`]", s.text, rule.op);
                let dests: Vec<usize> = e.dests.iter().chain(&e.weak_dests).copied().collect();
                // Each source alone, then the guard alone.
                let mut sources = e.srcs.clone();
                sources.sort_unstable();
                sources.dedup();
                for &src in &sources {
                    let mut st = State::public();
                    secret(&mut st, src);
                    let out = after(&s, &st);
                    for &d in &dests {
                        assert_ne!(
                            out.t[d],
                            NONE,
                            "{what}: secret {} does not reach {}",
                            taint::loc_name(src),
                            taint::loc_name(d)
                        );
                    }
                    // A secret data operand of a store reaches the memory cell it writes.
                    let cell = match rule.class {
                        Class::Store(Space::Shared) | Class::Atomic(Space::Shared) => Some(SMEM),
                        Class::Store(Space::Local) => Some(LMEM),
                        Class::Store(Space::Generic) | Class::Atomic(Space::Generic) => Some(SMEM),
                        Class::Barrier if opcode.contains(".RED") => Some(BARRES),
                        _ => None,
                    };
                    if let Some(c) = cell {
                        assert_ne!(
                            out.t[c],
                            NONE,
                            "{what}: {} stays public",
                            taint::loc_name(c)
                        );
                    }
                    checked += 1;
                }
                // A secret guard: every destination may keep its old value or take the new one.
                let gs = synth(&opcode, &ops, Some("P6"));
                let mut st = State::public();
                secret(&mut st, P_BASE + 6);
                let out = after(&gs, &st);
                for &d in &dests {
                    assert_ne!(
                        out.t[d],
                        NONE,
                        "{what}: secret guard does not reach {}",
                        taint::loc_name(d)
                    );
                }
                // Memory cells flow into what is loaded from them.
                let from_cell = match rule.class {
                    Class::Load(Space::Shared) | Class::Atomic(Space::Shared) => Some(SMEM),
                    Class::Load(Space::Local) => Some(LMEM),
                    Class::BarrierResult => Some(BARRES),
                    _ => None,
                };
                let intrinsic = matches!(
                    rule.class,
                    Class::Load(Space::Global | Space::Generic)
                        | Class::Atomic(Space::Global | Space::Generic)
                        | Class::Gmma
                        | Class::Texture
                );
                if let Some(c) = from_cell {
                    let mut st = State::public();
                    secret(&mut st, c);
                    let out = after(&s, &st);
                    for &d in &dests {
                        assert_ne!(
                            out.t[d],
                            NONE,
                            "{what}: {} does not reach {}",
                            taint::loc_name(c),
                            taint::loc_name(d)
                        );
                    }
                }
                let out = after(&s, &State::public());
                if intrinsic {
                    for &d in &dests {
                        assert_ne!(
                            out.t[d], NONE,
                            "{what}: a load from global memory is public"
                        );
                    }
                }
                if rule.class == Class::AsyncToShared {
                    assert_ne!(out.t[SMEM], NONE, "{what}: the copied bytes are public");
                }
                if rule.class == Class::Special {
                    assert!(dests.iter().all(|&d| out.t[d] == NONE), "{what}");
                }
            }
        }
    }
    assert!(checked > 300, "only {checked} source→destination checks");
}

#[test]
fn every_opcode_every_form_has_the_sinks_of_its_class() {
    for rule in TABLE {
        for opcode in opcode_text(rule.op) {
            for form in rule.forms {
                let ops = operands(form);
                let s = synth(&opcode, &ops, None);
                let what = format!("{} [{} / form `{form}`]", s.text, rule.op);
                let class = rule.class;
                // A secret guard.
                let gs = synth(&opcode, &ops, Some("P6"));
                let mut st = State::public();
                secret(&mut st, P_BASE + 6);
                let f = sink_findings(&gs, st);
                // A secret guard decides whether the instruction runs: a sink wherever running it
                // or not is observable (control, barriers, memory, collectives, waits), a mere
                // data flow for arithmetic.
                let guard_is_sink = match class {
                    Class::Alu
                    | Class::Special
                    | Class::AluLatency
                    | Class::Mma
                    | Class::BarrierResult => false,
                    Class::Sync => rule.op != "NOP",
                    _ => true,
                };
                assert_eq!(
                    !f.is_empty(),
                    guard_is_sink,
                    "{what}: secret guard gives {f:#?}"
                );
                // Each register or predicate operand.
                let insn = &s.sec.insns[0];
                let addr = address_locs(&s);
                let e = &s.effects[0];
                let mut sources = e.srcs.clone();
                sources.sort_unstable();
                sources.dedup();
                for &src in &sources {
                    let mut st = State::public();
                    secret(&mut st, src);
                    let f = sink_findings(&s, st);
                    let is_pred = (P_BASE..SMEM).contains(&src);
                    let expect = match class {
                        // Predicate operands, targets, return addresses, masks.
                        Class::Control => true,
                        Class::Barrier => !is_pred,
                        // ELECT's register operand is its member mask.
                        Class::Collective => rule.op == "ELECT" && !is_pred,
                        Class::Sleep => true,
                        Class::AluLatency => rule.op == "FCHK",
                        Class::Mbarrier
                        | Class::Texture
                        | Class::AsyncToShared
                        | Class::AsyncFromShared
                        | Class::Prefetch => addr.contains(&src) || !is_pred,
                        c if taint::is_memory(rule.op) => {
                            let _ = c;
                            addr.contains(&src)
                        }
                        Class::Load(Space::Constant) => false,
                        _ => false,
                    };
                    assert_eq!(
                        !f.is_empty(),
                        expect,
                        "{what}: secret {} gives {f:#?}",
                        taint::loc_name(src)
                    );
                    let _ = insn;
                }
            }
        }
    }
}

#[test]
fn mbarrier_arrive_count_and_constant_index_are_sinks() {
    let s = synth(
        "SYNCS.ARRIVE.TRANS64",
        &["RZ".into(), "[R40]".into(), "R20".into()],
        None,
    );
    let mut st = State::public();
    secret(&mut st, 20);
    assert_eq!(sink_findings(&s, st).len(), 1);
    let s = synth("LDC", &["R10".into(), "c[0x3][R20]".into()], None);
    let mut st = State::public();
    secret(&mut st, 20);
    let f = sink_findings(&s, st);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].rule, flashcore::audit::Rule::MemoryAddress);
}

#[test]
fn table_covers_the_opcodes_of_nvidias_hopper_list() {
    // NVIDIA's "CUDA Binary Utilities", Hopper instruction set (CUDA 13.x edition).
    const HOPPER: &str = "FADD FADD32I FCHK FFMA32I FFMA FMNMX FMUL FMUL32I FSEL FSET FSETP \
        FSWZADD MUFU HADD2 HADD2_32I HFMA2 HFMA2_32I HMMA HMNMX2 HMUL2 HMUL2_32I HSET2 HSETP2 \
        DADD DFMA DMMA DMUL DSETP BMMA BMSK BREV FLO IABS IADD IADD3 IADD32I IDP IDP4A IMAD \
        IMMA IMNMX IMUL IMUL32I ISCADD ISCADD32I ISETP LEA LOP LOP3 LOP32I POPC SHF SHL SHR \
        VABSDIFF VABSDIFF4 VHMNMX VIADD VIADDMNMX VIMNMX VIMNMX3 F2F F2I I2F I2I I2IP I2FP F2IP \
        FRND MOV MOV32I MOVM PRMT SEL SGXT SHFL PLOP3 PSETP P2R R2P FENCE LD LDC LDG LDGDEPBAR \
        LDGMC LDGSTS LDL LDS LDSM STSM ST STG STL STS STAS SYNCS MATCH QSPC ATOM ATOMS ATOMG \
        REDAS REDG CCTL CCTLL ERRBAR MEMBAR CCTLT R2UR REDUX S2UR UBMSK UBREV UCGABAR_ARV \
        UCGABAR_WAIT UCLEA UF2FP UFLO UIADD3 UIMAD UISETP ULDC ULEA ULEPC ULOP ULOP3 ULOP32I \
        UMOV UP2UR UPLOP3 UPOPC UPRMT UPSETP UR2UP USEL USETMAXREG USGXT USHF USHL USHR VOTEU \
        BGMMA HGMMA IGMMA QGMMA WARPGROUP WARPGROUPSET UBLKCP UBLKPF UBLKRED UTMACCTL \
        UTMACMDFLUSH UTMALDG UTMAPF UTMAREDG UTMASTG TEX TLD TLD4 TMML TXD TXQ SUATOM SULD SURED \
        SUST ACQBULK BMOV BPT BRA BREAK BRX BRXU BSSY BSYNC CALL CGAERRBAR ELECT ENDCOLLECTIVE \
        EXIT JMP JMX JMXU KILL NANOSLEEP PREEXIT RET RPCMOV WARPSYNC YIELD B2R BAR CS2R DEPBAR \
        GETLMEMBASE LEPC NOP PMTRIG S2R SETCTAID SETLMEMBASE VOTE";
    let missing: Vec<&str> = HOPPER
        .split_whitespace()
        .filter(|op| table::lookup(op).is_none())
        .collect();
    assert!(missing.is_empty(), "not in the rule table: {missing:?}");
}

// ---- Refusals through the CLI ----

fn listing(body: &str) -> String {
    format!("\t.section\t.text.k,\"ax\",@progbits\n        .type k,@function\nk:\n{body}")
}

/// The SASS of the cross-lane vote kernel, as nvdisasm prints it (the part that matters).
const ISSUE_12: &str = "        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
        /*0020*/                   LDC.64 R2, c[0x0][0x210] ;
        /*0030*/                   ULDC.64 UR6, c[0x0][0x208] ;
        /*0040*/                   IMAD.WIDE R2, R0, 0x4, R2 ;
        /*0050*/                   LDG.E R2, desc[UR6][R2.64] ;
        /*0060*/                   LDC R7, c[0x0][0x224] ;
        /*0070*/                   FSETP.GT.AND P0, PT, R2, 100, PT ;
        /*0080*/                   VOTE.ANY P0, P0 ;
        /*0090*/                   ISETP.LT.OR P0, PT, R7, 0x1, !P0 ;
        /*00a0*/               @P0 BRA `(.L_x_34) ;
        /*00b0*/                   FMUL.RZ R7, R2, 0.15915493667125701904 ;
.L_x_34:
        /*00c0*/                   EXIT ;
";

fn run_listing(body: &str, json: bool) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("k.sass");
    std::fs::write(&p, listing(body)).unwrap();
    let mut args = vec!["audit", "--sass", p.to_str().unwrap()];
    if json {
        args.push("--json");
    }
    flashcore(&args)
}

#[test]
fn unknown_opcode_exits_2_naming_it() {
    let (code, out, err) = run_listing(
        "/*0000*/ LDG.E R2, desc[UR6][R2.64] ;\n/*0010*/ FROBNICATE R3, R2 ;\n/*0020*/ EXIT ;\n",
        false,
    );
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("FROBNICATE") && err.contains("rule table"),
        "{err}"
    );
    assert!(!out.contains("data-oblivious"), "{out}");
}

#[test]
fn unknown_operand_form_exits_2_naming_it() {
    // VOTE with two general registers is no form VOTE has.
    let (code, _, err) = run_listing("/*0000*/ VOTE.ANY R1, R2 ;\n/*0010*/ EXIT ;\n", false);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("VOTE.ANY") && err.contains("form"), "{err}");
}

#[test]
fn issue_12_listing_is_flagged_with_its_chain_and_json_names_the_table() {
    let (code, out, err) = run_listing(ISSUE_12, false);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("@P0 BRA"), "{out}");
    // The chain runs through the vote.
    let chain_at = out.find("taint chain").expect("a taint chain");
    let chain = &out[chain_at..];
    for step in [
        "LDG.E R2",
        "FSETP.GT.AND P0",
        "VOTE.ANY P0, P0",
        "ISETP.LT.OR P0",
    ] {
        assert!(chain.contains(step), "chain lacks {step}:\n{out}");
    }
    let (code, out, _) = run_listing(ISSUE_12, true);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["rule_table"], table::VERSION);
    assert_eq!(v[0]["findings"][0]["rule"], "control-flow");
    assert!(v[0]["findings"][0]["chain"].as_array().unwrap().len() >= 4);
    // The same listing with the vote on a public predicate is clean.
    let public = ISSUE_12.replace(
        "FSETP.GT.AND P0, PT, R2, 100, PT",
        "ISETP.GE.AND P0, PT, R0, 0x64, PT",
    );
    let (code, out, err) = run_listing(&public, false);
    assert_eq!(code, 0, "{out}\n{err}");
}
