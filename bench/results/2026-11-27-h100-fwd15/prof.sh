#!/usr/bin/env bash
# Same-process bits check of the split builds (data bytes only), then ncu of flashcore and cuDNN at
# the S = 512 causal shapes: per-opcode instruction counts and the launch/stall/scheduler sections.
set -u
cd "$(dirname "$0")"
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
W=/tmp/prof; mkdir -p $W
cat > /tmp/h.py <<'PY'
import sys, struct, hashlib, json
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
print(" ".join(f"{k}:{hashlib.sha256(data[v['data_offsets'][0]:v['data_offsets'][1]]).hexdigest()[:12]}" for k, v in sorted(h.items()) if k != "__metadata__"))
PY
for f in "in64 " "in64 --causal" "in128 " "in128 --causal"; do
  for b in ${BINS:-x0 x1 x2}; do set -- $f
    ./flashcore-$b attn --input $1.safetensors --output /tmp/o.safetensors --lse $2 >/dev/null 2>&1 || echo FAIL
    echo "$b $f $(python3 /tmp/h.py /tmp/o.safetensors)"
  done
done | tee $W/bits.txt
NCU="/usr/local/cuda/bin/ncu --section LaunchStats --section Occupancy --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum,sm__cycles_elapsed.avg --print-metric-instances details"
cat > /tmp/cudnn.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, S, D = map(int, sys.argv[1:5])
q, k, v = (torch.randn(B, H, S, D, device='cuda', dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(4): F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
PY
for shape in "32 32 512 64" "32 16 512 128"; do set -- $shape
  timeout 120 $NCU -k regex:flashcore_attention_fwd --launch-skip 3 --launch-count 1 ./flashcore-x0 bench --batch $1 --heads $2 --seqlen $3 --headdim $4 --causal --dtype bf16 --mode event --reps 2 --warmup 2 > $W/ncu-fc-$3-$4.txt 2>&1
  timeout 120 $NCU -k regex:"sdpa|fmha|flash|cudnn" --launch-skip 2 --launch-count 1 python3 /tmp/cudnn.py $shape > $W/ncu-cudnn-$3-$4.txt 2>&1
done
tar czf $OUT/prof.tgz -C /tmp prof
grep -h -E "Duration|Executed Ipc A|Registers Per|Threads  |Grid Size|Achieved Occ|SM Frequency|Warp Cycles Per Issued|No Eligible|smsp__inst_executed.sum " $W/ncu-*.txt
