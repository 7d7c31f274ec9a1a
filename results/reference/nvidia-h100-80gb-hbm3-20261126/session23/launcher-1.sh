#!/usr/bin/env bash
# device launcher for session #23's H100 time (git-ignored, never committed)
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
PY=python3
R=results/h100-s23
mkdir -p "$R" "$OUT"
exec > >(tee -a "$R/launcher.log") 2>&1
pack() { find "$R" ~/.cache/parabench/logs -type f -size -300k 2>/dev/null | tar czf "$OUT/.r.tgz" -T - 2>/dev/null; mv -f "$OUT/.r.tgz" "$OUT/r.tgz"; }
CLI=($PY -m bench.cli)
C=(--device cuda --data-root .data --out-dir "$R")
{ nvidia-smi; nproc; $PY -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'; } > "$R/machine.txt" 2>&1
$PY -m pip install --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1; echo "[$(el)s] install rc=$?"
( while sleep 15; do pack; done ) &
COPIER=$!
( cd .apex && taskset -c 8-15 $PY -m pip install --no-deps --no-build-isolation . > "../$R/apex-install.log" 2>&1; echo "apex install rc=$? at $(el)s" >> "../$R/apex-install.log" ) &
APEX=$!
# 1. alone on the GPU: what the harness's loop adds, and its parts
for t in sync events; do
  timeout -k 5 70 taskset -c 0-7 $PY benchmarks/overhead.py --device cuda --data-root .data --loop-cost-only --step-timing $t > "$R/loop-cost-$t.txt" 2>&1
  echo "[$(el)s] loop-cost $t rc=$?"; cat "$R/loop-cost-$t.txt" | tail -6
done
wait $APEX; tail -1 "$R/apex-install.log"
$PY -c 'import apex.amp, apex.parallel; print("apex.amp imports")' 2>&1 | tail -1
# 2. the whole GPU test file, beside functional checks (no figures from these are timings)
( timeout -k 10 400 env PARABENCH_TEST_DATA=.data $PY -m pytest -q -ra --durations=0 tests/test_gpu.py -p no:cacheprovider > "$R/test_gpu.log" 2>&1; echo "[$(el)s] test_gpu rc=$?" >> "$R/test_gpu.log" ) &
TESTS=$!
timeout -k 5 100 "${CLI[@]}" verify "${C[@]}" --run-id verify-syncbn --dataset synthetic --model resnet18 --image-size 32 \
  --world-sizes 1,2 --strategies ddp_torchrun --sync-bn --oversubscribe > "$R/verify-syncbn.log" 2>&1
echo "[$(el)s] verify syncbn rc=$?"; tail -8 "$R/verify-syncbn.log"
timeout -k 5 100 "${CLI[@]}" verify "${C[@]}" --run-id verify-bf16-ws2 --world-sizes 1,2 --strategies ddp_torchrun,ddp_bf16_hook --oversubscribe > "$R/verify-bf16.log" 2>&1
echo "[$(el)s] verify bf16 ws2 rc=$?"; tail -8 "$R/verify-bf16.log"
timeout -k 10 200 "${CLI[@]}" run "${C[@]}" --run-id resnet50-ws2-functional --dataset synthetic --model resnet50 --image-size 224 \
  --global-batch 256 --world-sizes 2 --max-steps 8 --warmup-steps 2 --precision bf16 --channels-last --oversubscribe > "$R/resnet50-ws2.log" 2>&1
echo "[$(el)s] resnet50 ws2 functional rc=$?"; tail -25 "$R/resnet50-ws2.log"
wait $TESTS; tail -25 "$R/test_gpu.log"
kill $COPIER 2>/dev/null; pack; echo "[$(el)s] done"
