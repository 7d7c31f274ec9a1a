#!/usr/bin/env bash
set -u
PY=python3; R=results/h100-20261126
C=(--device cuda --data-root .data --out-dir "$R")
PARABENCH_TEST_DATA=.data timeout 40 $PY -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider -k "harness_itself or held_memory" > $R/test_gpu_b.log 2>&1; echo "tests b rc=$?"; tail -2 $R/test_gpu_b.log
for t in sync events; do
  timeout -k 5 75 $PY -m bench.cli run "${C[@]}" --run-id mnist-timing-$t --dataset mnist --world-sizes 1 --repeats 3 \
    --data-path device --strategies single --step-timing $t 2>&1 | tail -4
done
$PY -m bench.cli compare $R/mnist-timing-sync $R/mnist-timing-events | tee $R/compare-timing.txt
find $R -type f -size -300k -newer $R/launcher.log | tar czf $OUT/r2.tgz -T -
