#!/usr/bin/env bash
# device launcher for session #22's H100 time (git-ignored, never committed)
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
PY=python3
export PYTHON=$PY PARABENCH_DATA_ROOT=.data GPU_CHECK_REPEATS=1
R=results/h100-20261126
export GPU_CHECK_OUT=$R
mkdir -p "$R" "$OUT"
exec > >(tee -a "$OUT/launcher.log") 2>&1
pack() { cp "$OUT/launcher.log" "$R/" 2>/dev/null; tar czf "$OUT/.r.tgz" "$R" ~/.cache/parabench/logs 2>/dev/null; mv -f "$OUT/.r.tgz" "$OUT/r.tgz"; }
CLI=($PY -m bench.cli)
C=(--device cuda --data-root .data --out-dir "$R")
{ nvidia-smi; nproc; $PY -c 'import torch, sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), torch.cuda.nccl.version(), torch.cuda.get_device_name(0))'; cmake --version; g++ --version; } > "$R/machine.txt" 2>&1
$PY -m pip install --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1; echo "[$(el)s] install rc=$?"
( while sleep 10; do pack; done ) &
COPIER=$!
( taskset -c 8-15 env PARABENCH_HOROVOD_JOBS=8 scripts/build_horovod.sh $PY > "$R/hvd-build.log" 2>&1; echo "build rc=$? at $(el)s" >> "$R/hvd-build.log" ) &
BUILD=$!
for t in sync events; do
  timeout -k 5 60 taskset -c 0-7 $PY benchmarks/overhead.py --device cuda --data-root .data --loop-cost-only --step-timing $t > "$R/loop-cost-$t.txt" 2>&1
  echo "[$(el)s] loop-cost $t rc=$?"; tail -4 "$R/loop-cost-$t.txt"
done
timeout -k 10 120 taskset -c 0-7 "${CLI[@]}" run "${C[@]}" --run-id mnist-cudagraphs --dataset mnist --world-sizes 1 \
  --repeats 2 --data-path device --strategies single --compile off,on --compile-mode reduce-overhead
echo "[$(el)s] mnist-cudagraphs rc=$?"
timeout -k 5 60 taskset -c 0-7 env PARABENCH_TEST_DATA=.data $PY -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider -k "held_memory or events or harness_itself" > "$R/test_gpu_a.log" 2>&1
echo "[$(el)s] tests a rc=$?"; tail -3 "$R/test_gpu_a.log"
while kill -0 $BUILD 2>/dev/null && [ "$(el)" -lt 230 ]; do sleep 2; done
echo "[$(el)s] build: $(tail -1 "$R/hvd-build.log")"
$PY -c 'import horovod.torch as h; print("horovod nccl_built", h.nccl_built())'
timeout -k 15 290 "${CLI[@]}" run "${C[@]}" --run-id resnet50-strategies --dataset synthetic --model resnet50 \
  --image-size 224 --global-batch 256 --world-sizes 1 --max-steps 40 --warmup-steps 10 --precision bf16 \
  --channels-last --oversubscribe
echo "[$(el)s] resnet50-strategies rc=$?"
if $PY -c 'import horovod.torch' 2>/dev/null; then
  timeout -k 5 50 env PARABENCH_TEST_DATA=.data $PY -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider -k horovod > "$R/test_gpu_hvd.log" 2>&1
  echo "[$(el)s] tests hvd rc=$?"; tail -3 "$R/test_gpu_hvd.log"
  timeout -k 5 60 "${CLI[@]}" verify "${C[@]}" --run-id horovod-verify --world-sizes 1 --strategies horovod,horovod_fp16
  echo "[$(el)s] horovod verify rc=$?"
fi
kill $COPIER 2>/dev/null; pack; echo "[$(el)s] done"
