#!/usr/bin/env bash
# bench/peer_pipeline.sh: tapeline's 4-process 1F1B GPT-2 (bench_pipeline's gpt2_4x256 row: 4 x 256,
# context 64, 8 micro-batches, 1 thread a rank, Gloo, body checksums on) against
# torch.distributed.pipelining's Schedule1F1B on the same model and machine
# (bench/peer/torch_pipelining_gpt2.py), side by side: the two alternate, RUNS times. Prints one JSON
# line per run and a summary:
#   {"bench":"peer_pipeline","run":i,"tapeline_s":...,"torch_s":...,"ratio":tapeline/torch}
#   {"bench":"peer_pipeline","runs":N,"ratio_median":...,"target":0.9}
# or {"bench":"peer_pipeline","skipped":"<why>"} where the wheel's torch or the build is absent.
# Step = forward and backward of the 8 micro-batches (no optimizer), median over STEPS steps.
# Usage: bench/peer_pipeline.sh [RUNS (3)] [STEPS (5)]; TAPELINE_TORCH_PY: the wheel's package dir.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3} steps=${2:-5}
py=${TAPELINE_TORCH_PY:-/root/.cache/tapeline/torch-2.15.0}
skip() { printf '{"bench":"peer_pipeline","skipped":"%s"}\n' "$1"; exit 0; }
[ -x build/bench/bench_pipeline ] || skip "build/bench/bench_pipeline is not built (scripts/build --target bench_pipeline)"
PYTHONPATH=$py python3 -c 'import torch.distributed.pipelining' 2>/dev/null ||
  skip "no torch with torch.distributed.pipelining at $py (TAPELINE_TORCH_PY)"
ratios=()
for i in $(seq 1 "$runs"); do
  t=$(build/bench/bench_pipeline "$steps" 8 --models gpt2 --mp 4 --mp-only --no-links 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        d = json.loads(l)
        if d.get("bench") == "pipeline_mp" and d.get("schedule") == "1f1b": print(d["wall_s"])')
  p=$(PYTHONPATH=$py OMP_NUM_THREADS=1 python3 bench/peer/torch_pipelining_gpt2.py --steps "$steps" 2>/dev/null |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["step_s"])')
  [ -n "$t" ] && [ -n "$p" ] || skip "run $i: a side printed no step time (tapeline '$t', torch '$p')"
  r=$(python3 -c "print(round($t / $p, 3))")
  ratios+=("$r")
  printf '{"bench":"peer_pipeline","run":%d,"tapeline_s":%s,"torch_s":%s,"ratio":%s}\n' "$i" "$t" "$p" "$r"
done
med=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
printf '{"bench":"peer_pipeline","runs":%d,"ratio_median":%s,"target":0.9}\n' "$runs" "$med"
