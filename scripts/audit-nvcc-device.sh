#!/usr/bin/env bash
# `flashcore audit --cubin` on what nvcc builds, against `--source` (NVRTC) on the same files.
# For the GPU machine (CUDA 13 with nvcc at /usr/local/cuda, no Rust), with the release binary
# carried in:
#   bash scripts/audit-nvcc-device.sh .carry/flashcore
# For each test file (a multi-kernel file with host code, and one with toolkit headers), nvcc
# builds a cubin (-cubin), an object (-c), a fat binary (-fatbin) and an executable, all with
# `-gencode=arch=compute_90a,code=sm_90a -lineinfo`; each is audited and every kernel's verdict
# (clean or not) must equal NVRTC's, and every finding must name a source line. Also checks
# `--secret-param NAME --signatures FILE.cu` on an nvcc cubin. Exits non-zero on any
# disagreement or error. Logs and JSON go to $OUT/audit-nvcc (else device-out/audit-nvcc).
# NVCC=/path/to/nvcc overrides the compiler.
set -uo pipefail
bin="${1:?usage: $0 PATH/TO/flashcore}"
bin="$(realpath "$bin")"
cd "$(dirname "$0")/.."
out="${OUT:-device-out}/audit-nvcc"
mkdir -p "$out"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
gen=(-gencode=arch=compute_90a,code=sm_90a -lineinfo)
status=0
{
    echo "nvcc: $nvcc"
    "$nvcc" --version | tail -2
    echo "flashcore: $bin"
} | tee "$out/env.txt"

# file, NVRTC defines that leave out its host code
cases=(
    "tests/audit_corpus/nvcc/multi.cu|-D NO_HOST_CODE"
    "tests/audit_corpus/user/headers.cu|"
)
for c in "${cases[@]}"; do
    src="${c%%|*}"
    defs="${c#*|}"
    name="$(basename "$src" .cu)"
    # shellcheck disable=SC2086
    "$bin" audit --json --source "$src" $defs >"$out/$name.nvrtc.json" 2>"$out/$name.nvrtc.err"
    rc=$?
    if [[ $rc -gt 1 ]]; then
        echo "FAIL $name: --source exited $rc: $(head -5 "$out/$name.nvrtc.err")"
        status=1
        continue
    fi
    for kind in cubin object fatbin executable; do
        case $kind in
            cubin) flag=-cubin; f="$work/$name.cubin" ;;
            object) flag=-c; f="$work/$name.o" ;;
            fatbin) flag=-fatbin; f="$work/$name.fatbin" ;;
            executable) flag=; f="$work/$name.exe" ;;
        esac
        if [[ $kind == executable && $name != multi ]]; then
            continue # no main()
        fi
        # shellcheck disable=SC2086
        if ! "$nvcc" $flag "${gen[@]}" -o "$f" "$src" >"$out/$name.$kind.nvcc.log" 2>&1; then
            echo "FAIL $name $kind: nvcc failed: $(tail -3 "$out/$name.$kind.nvcc.log")"
            status=1
            continue
        fi
        "$bin" audit --json --cubin "$f" --arch sm_90a >"$out/$name.$kind.json" 2>"$out/$name.$kind.err"
        rc=$?
        if [[ $rc -gt 1 ]]; then
            echo "FAIL $name $kind: --cubin exited $rc: $(head -5 "$out/$name.$kind.err")"
            status=1
            continue
        fi
        if python3 - "$out/$name.nvrtc.json" "$out/$name.$kind.json" <<'EOF'; then
import json, sys
def verdicts(p):
    ks = json.load(open(p))
    return {k["name"]: len(k["findings"]) == 0 for k in ks}, ks
want, _ = verdicts(sys.argv[1])
got, ks = verdicts(sys.argv[2])
bad = []
if set(want) != set(got):
    bad.append(f"kernels differ: NVRTC {sorted(want)} nvcc {sorted(got)}")
for k in sorted(set(want) & set(got)):
    if want[k] != got[k]:
        bad.append(f"{k}: NVRTC {'clean' if want[k] else 'LEAK'}, nvcc {'clean' if got[k] else 'LEAK'}")
for k in ks:
    for f in k["findings"]:
        if "source" not in f:
            bad.append(f"{k['name']} finding at {f['offset']:#x} has no source line")
summary = ", ".join(f"{k}={'clean' if v else 'LEAK'}" for k, v in sorted(got.items()))
print(("AGREE " if not bad else "DISAGREE ") + summary)
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
EOF
            echo "PASS $name $kind"
        else
            echo "FAIL $name $kind (above)"
            status=1
        fi
    done
done 2>&1 | tee "$out/report.txt"
grep -q '^FAIL' "$out/report.txt" && status=1

# A secret parameter named in the source, on nvcc's cubin of the multi-kernel file.
if [[ -f "$work/multi.cubin" ]] || "$nvcc" -cubin "${gen[@]}" -o "$work/multi.cubin" tests/audit_corpus/nvcc/multi.cu >/dev/null 2>&1; then
    "$bin" audit --cubin "$work/multi.cubin" --kernel sum_len >"$out/secret-none.txt" 2>&1
    a=$?
    "$bin" audit --cubin "$work/multi.cubin" --kernel sum_len --secret-param len \
        --signatures tests/audit_corpus/nvcc/multi.cu >"$out/secret-len.txt" 2>&1
    b=$?
    if [[ $a == 0 && $b == 1 ]]; then
        echo "PASS secret-param by name on an nvcc cubin (exit $a without, $b with)" | tee -a "$out/report.txt"
    else
        echo "FAIL secret-param by name on an nvcc cubin: exit $a without (want 0), $b with (want 1)" | tee -a "$out/report.txt"
        status=1
    fi
fi
# The work folder goes when the script exits; the cubins are small, keep them with the logs.
cp "$work"/*.cubin "$out/" 2>/dev/null || true
echo "audit-nvcc: $([[ $status == 0 ]] && echo ALL AGREE || echo DISAGREEMENT OR ERROR) (logs in $out)"
exit $status
