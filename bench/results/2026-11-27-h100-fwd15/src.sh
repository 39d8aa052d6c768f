#!/usr/bin/env bash
# Per-instruction SASS with executed counts (ncu source page) of flashcore and cuDNN at
# 32,32,512,64 causal bf16; plus the data-only bits check of the split builds.
set -u
cd "$(dirname "$0")"
export FLASHCORE_CACHE_DIR=/tmp/fc-cache
W=/tmp/src; mkdir -p $W
cat > /tmp/h.py <<'PY'
import sys, struct, hashlib, json
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); data = b[8 + n:]
print(" ".join(f"{k}:{hashlib.sha256(data[v['data_offsets'][0]:v['data_offsets'][1]]).hexdigest()[:12]}" for k, v in sorted(h.items()) if k != "__metadata__"))
PY
for f in in64:0 in64:1 in128:0 in128:1; do
  for b in ${BINS:-x0 x1 x2}; do
    c=""; [ ${f#*:} = 1 ] && c=--causal
    ./flashcore-$b attn --input ${f%:*}.safetensors --output /tmp/o.safetensors --lse $c >/dev/null 2>&1 || echo FAIL
    echo "$b $f $(python3 /tmp/h.py /tmp/o.safetensors)"
  done
done | tee $W/bits.txt
cat > /tmp/cudnn.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
B, H, S, D = map(int, sys.argv[1:5])
q, k, v = (torch.randn(B, H, S, D, device='cuda', dtype=torch.bfloat16) for _ in range(3))
with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
    for _ in range(4): F.scaled_dot_product_attention(q, k, v, is_causal=True)
torch.cuda.synchronize()
PY
NCU="/usr/local/cuda/bin/ncu --section SourceCounters --import-source no"
timeout 150 $NCU -k regex:flashcore_attention_fwd --launch-skip 3 --launch-count 1 -o $W/fc ./flashcore-x0 bench --batch 32 --heads 32 --seqlen 512 --headdim 64 --causal --dtype bf16 --mode event --reps 2 --warmup 2 > $W/fc.log 2>&1
timeout 150 $NCU -k regex:"sdpa|fmha|flash|cudnn" --launch-skip 2 --launch-count 1 -o $W/cudnn python3 /tmp/cudnn.py 32 32 512 64 > $W/cudnn.log 2>&1
for x in fc cudnn; do timeout 60 /usr/local/cuda/bin/ncu -i $W/$x.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $W/$x-sass.csv.gz; done
rm -f $W/*.ncu-rep
tar czf $OUT/src.tgz -C /tmp src
ls -la $W; tail -3 $W/*.log
