#!/usr/bin/env bash
set -u
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
PY=python3
R=results/h100-s23b
mkdir -p "$R" "$OUT"
exec > >(tee -a "$R/launcher.log") 2>&1
pack() { find "$R" -type f -size -300k 2>/dev/null | tar czf "$OUT/.r.tgz" -T - 2>/dev/null; mv -f "$OUT/.r.tgz" "$OUT/r.tgz"; }
C=(--device cuda --data-root .data --out-dir "$R")
$PY -c 'import importlib.metadata as m; m.version("parabench")' 2>/dev/null || $PY -m pip install --no-deps --no-build-isolation -e . > "$R/install.log" 2>&1
echo "[$(el)s] installed"
( while sleep 15; do pack; done ) &
COPIER=$!
timeout -k 5 100 taskset -c 0-7 $PY .whl/ablate.py cuda 9 2>&1 | tee "$R/ablate.txt"
echo "[$(el)s] ablate"
timeout -k 5 160 $PY -m bench.cli verify "${C[@]}" --run-id verify-syncbn --dataset synthetic --model resnet18 --image-size 32 \
  --world-sizes 1,2 --strategies ddp_torchrun --sync-bn --oversubscribe > "$R/verify-syncbn.log" 2>&1 &
V1=$!
timeout -k 5 160 $PY -m bench.cli verify "${C[@]}" --run-id verify-bf16-ws2 --world-sizes 1,2 --strategies ddp_torchrun,ddp_bf16_hook --oversubscribe > "$R/verify-bf16.log" 2>&1 &
V2=$!
wait $V1; echo "[$(el)s] verify syncbn rc=$?"; tail -12 "$R/verify-syncbn.log"
wait $V2; echo "[$(el)s] verify bf16 rc=$?"; tail -12 "$R/verify-bf16.log"
kill $COPIER 2>/dev/null; pack; echo "[$(el)s] done"
