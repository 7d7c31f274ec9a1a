#!/usr/bin/env bash
# The GPU path, run for real on a machine with a CUDA GPU and no network:
#   scripts/gpu_check.sh [PART ...]      (make gpu-check runs every part)
# Parts, each well under 10 minutes on one H100:
#   install   the project from this working tree into the machine's Python; fetches nothing
#   tests     pytest tests/test_gpu.py (its log beside the results)
#   mnist     every strategy on MNIST at world sizes 1 and 2, data on the device, then the
#             same through the DataLoader (the loader's cost, same machine)
#   resnet50  resnet50 on synthetic data, batch 256: fp32 and bf16, NCHW and channels-last
#   compile   the same with torch.compile, bf16 and channels-last
# Results: results/reference/<gpu>-<date>/<part>/ (runs.csv, report.md, plots).
# Data: $PARABENCH_DATA_ROOT, else ../shared/data, else .data (copy MNIST there to carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(install tests mnist resnet50 compile)

if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "gpu-check: $PY cannot import torch; set PYTHON to the interpreter that has it" >&2
    exit 2
fi
if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: torch sees no CUDA device here (torch.cuda.is_available() is False); it needs one" >&2
    exit 2
fi
DATA=${PARABENCH_DATA_ROOT:-}
for cand in ../shared/data .data; do
    [ -n "$DATA" ] || { [ -d "$cand" ] && DATA=$cand; }
done
DATA=${DATA:-data}
GPU=$("$PY" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-"))')
OUT=${GPU_CHECK_OUT:-results/reference/$GPU-$(date +%Y%m%d)}
mkdir -p "$OUT"
run() { "$PY" -m bench.cli run --device cuda --data-root "$DATA" --out-dir "$OUT" "$@"; }

for part in "${PARTS[@]}"; do
    echo "== gpu-check: $part -> $OUT" >&2
    case $part in
        install)
            "$PY" -c 'import importlib.metadata as m; m.version("parabench")' 2>/dev/null \
                || "$PY" -m pip install --no-deps --no-build-isolation -e . ;;
        tests)
            "$PY" -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider 2>&1 | tee "$OUT/test_gpu.log" ;;
        mnist)
            run --run-id mnist-device --dataset mnist --world-sizes 1,2 --repeats 2 --data-path device
            run --run-id mnist-loader --dataset mnist --world-sizes 1 --repeats 2 --data-path loader \
                --strategies single,ddp_torchrun ;;
        resnet50)
            run --run-id resnet50 --dataset synthetic --model resnet50 --image-size 224 \
                --global-batch 256 --world-sizes 1 --max-steps 40 --warmup-steps 10 \
                --strategies single,ddp_torchrun,fsdp --precision fp32,bf16 --channels-last off,on ;;
        compile)
            run --run-id resnet50-compile --dataset synthetic --model resnet50 --image-size 224 \
                --global-batch 256 --world-sizes 1 --max-steps 40 --warmup-steps 10 \
                --strategies single,ddp_torchrun --precision bf16 --channels-last --compile off,on ;;
        *)
            echo "gpu-check: unknown part '$part'; parts: install tests mnist resnet50 compile" >&2
            exit 2 ;;
    esac
done
echo "gpu-check: results in $OUT" >&2
