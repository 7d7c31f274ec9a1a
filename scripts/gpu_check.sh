#!/usr/bin/env bash
# The GPU path, run for real on a machine with a CUDA GPU and no network:
#   scripts/gpu_check.sh [PART ...]      (make gpu-check runs every part)
# Parts (minutes on one H100, 2026-11-24, GPU_CHECK_REPEATS=1: tests 6, resnet50 5, mnist 7,
# apex 2, compile about 4 (resnet50 alone), overhead about 4 per timing mode (its 6 paired
# rounds at least); results/reference/nvidia-h100-80gb-hbm3-20261124. On one H200,
# 2026-11-26: resnet50-all's world size 1 3.5, horovod 2.5 after a 2-minute build (16 cores);
# MNIST eager and with CUDA graphs, single alone, 1; results/reference/nvidia-h200-20261126.
# On the H100 again, 2026-11-26: resnet50-all's world size 1 4.7 with Horovod's rows, the
# build 2 minutes on 8 cores; results/reference/nvidia-h100-80gb-hbm3-20261126. Not yet
# timed: resnet50-all's world size 2, compile's MNIST runs whole):
#   install   the project from this working tree into the machine's Python; fetches nothing
#   horovod   build Horovod with NCCL (scripts/build_horovod.sh; from .whl/horovod-0.28.1.tar.gz
#             when carried, so nothing is fetched), then horovod and horovod_fp16 at world
#             size 1 and their parity with single
#   tests     pytest tests/test_gpu.py (its log beside the results)
#   mnist     every strategy on MNIST at world sizes 1 and 2 (2: ranks sharing the GPU over
#             gloo where a strategy can), data on the device; then single and ddp through the
#             DataLoader (the loader's cost, same machine), and timed by CUDA events
#             (--step-timing events: what synchronising around each step costs)
#   resnet50  resnet50 on synthetic data, batch 256: fp32 and bf16, NCHW and channels-last
#   resnet50-all  every strategy on resnet50, bf16 and channels-last, at world size 1, then 2
#             (ranks sharing the GPU over gloo where a strategy can)
#   compile   resnet50 with and without torch.compile, bf16 and channels-last; MNIST eager,
#             compiled, and compiled with CUDA graphs (--compile-mode reduce-overhead)
#   overhead  what the harness's loop adds to each step, and of which parts (overhead.py
#             --loop-cost-only, two minutes); then the harness against a hand-written loop on
#             the GPU (benchmarks/overhead.py), timing steps by synchronising, then by events
#   apex      apex_amp_ddp at O1 and O2 and their parity with single, where NVIDIA apex
#             (<= 25.05, with apex.amp) is installed; otherwise one line says it is not
# Results: results/reference/<gpu>-<date>/<part>/ (runs.csv, report.md, plots).
# Data: $PARABENCH_DATA_ROOT, else ../shared/data, else .data (copy MNIST there to carry it).
# Shorter, for a machine lent by the minute: GPU_CHECK_REPEATS (MNIST repeats, default 2),
# GPU_CHECK_OVERHEAD_MINUTES (the minutes after which each overhead comparison adds no more
# rounds to narrow its interval, default 3; its first 6 rounds always run, and took about 4
# minutes on the H100, so 3 or less is exactly those 6).
# GPU_CHECK_TESTS: a pytest -k expression choosing some of the GPU tests, for a machine whose
# command limit the whole file may not fit (6 minutes on one H100 when it held 10 of today's
# 17 tests); each selection logs to test_gpu-<expression>.log beside the others.
# A part cut off is finished by running it again into the same folder: GPU_CHECK_OUT names
# it on another day (the default folder carries the date; the script says which to name).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# Horovod is built second, so that its rows join the matrices after it and the GPU tests'
# Horovod test runs
ALL=(install horovod tests mnist resnet50 resnet50-all compile overhead apex)
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=("${ALL[@]}")
for part in "${PARTS[@]}"; do
    case " ${ALL[*]} " in
        *" $part "*) ;;
        *) echo "gpu-check: unknown part '$part'; parts: ${ALL[*]}" >&2; exit 2 ;;
    esac
done
# checked here, not where a part first passes them on: by then the install, Horovod's build
# and the GPU tests have taken minutes of a machine lent by the minute
REPEATS=${GPU_CHECK_REPEATS:-2}
OVERHEAD_MINUTES=${GPU_CHECK_OVERHEAD_MINUTES:-3}
if ! [[ $REPEATS =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu-check: GPU_CHECK_REPEATS must be a whole number of at least 1, got '$REPEATS'" >&2
    exit 2
fi
if ! [[ $OVERHEAD_MINUTES =~ ^([0-9]+\.?[0-9]*|\.[0-9]+)$ ]]; then
    echo "gpu-check: GPU_CHECK_OVERHEAD_MINUTES must be a number of minutes, got '$OVERHEAD_MINUTES'" >&2
    exit 2
fi

# GPU_CHECK_DRY_RUN=1: no GPU needed; each matrix is planned on the CPU (`--dry-run`: its
# cells, what is skipped and why) and the other commands are printed, not run. The tests
# use it to check every part's command line before a GPU machine's minutes are spent.
DRY=${GPU_CHECK_DRY_RUN:-0}
if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "gpu-check: $PY cannot import torch; set PYTHON to the interpreter that has it" >&2
    exit 2
fi
if [ "$DRY" != 1 ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: torch sees no CUDA device here (torch.cuda.is_available() is False); it needs one" >&2
    exit 2
fi
DATA=${PARABENCH_DATA_ROOT:-}
for cand in ../shared/data .data; do
    [ -n "$DATA" ] || { [ -d "$cand" ] && DATA=$cand; }
done
DATA=${DATA:-data}
if [ "$DRY" = 1 ]; then
    DEVICE=cpu GPU=dry-run PLAN=(--dry-run)
else
    DEVICE=cuda PLAN=()
    GPU=$("$PY" -c 'import re, torch; print(re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(0).lower()).strip("-"))')
fi
OUT=${GPU_CHECK_OUT:-results/reference/$GPU-$(date +%Y%m%d)}
if [ -z "${GPU_CHECK_OUT:-}" ] && [ "$DRY" != 1 ] && [ ! -d "$OUT" ]; then
    # an earlier day's check of this GPU: a part it left cut off is finished only in there
    for earlier in results/reference/"$GPU"-[0-9]*/; do
        [ -d "$earlier" ] && echo "gpu-check: an earlier check of this GPU is in ${earlier%/};" \
            "GPU_CHECK_OUT=${earlier%/} finishes its parts instead of starting anew in $OUT" >&2
    done
fi
[ "$DRY" = 1 ] || mkdir -p "$OUT"

# A command that fails is named at the end, and the parts after it still run: one broken
# strategy or a failed build costs its own figures, not the rest of the check's.
FAILED=()
do_() {
    if [ "$DRY" = 1 ]; then
        echo "gpu-check: would run: $*"
    elif ! "$@"; then
        FAILED+=("$part: $*")
    fi
}
# the matrices are planned for real in a dry run, except those this machine cannot plan
# (UNPLANNED says why: only CUDA can, or what they need is built by the part itself)
UNPLANNED=
parabench() {  # parabench run|verify ARGS...
    local cmd=$1
    shift
    if [ "$DRY" = 1 ] && [ -n "$UNPLANNED" ]; then
        echo "gpu-check: would run: parabench $cmd $* (not planned: $UNPLANNED)"
        return
    fi
    "$PY" -m bench.cli "$cmd" --device "$DEVICE" --data-root "$DATA" --out-dir "$OUT" ${PLAN[@]+"${PLAN[@]}"} "$@" \
        || FAILED+=("$part: parabench $cmd $*")
}
# A part cut off (a command limit, `timeout`) leaves its run directory: run again, the
# part finishes that run (--resume: the cells not done yet) and redoes a verify it cut off.
run() {  # run --run-id ID ARGS...
    local dir=$OUT/$2
    if [ "$DRY" != 1 ] && [ -f "$dir/config.json" ]; then
        echo "gpu-check: $dir exists: finishing it (--resume)" >&2
        "$PY" -m bench.cli run --resume "$dir" || FAILED+=("$part: parabench run --resume $dir")
        return
    fi
    parabench run "$@"
}
verify() {  # verify --run-id ID ARGS...
    local dir=$OUT/$2
    if [ "$DRY" != 1 ] && [ -d "$dir" ]; then
        if [ -f "$dir/verify.csv" ]; then
            echo "gpu-check: $dir is done" >&2
            return
        fi
        rm -rf "$dir"
    fi
    parabench verify "$@"
}
logged() {  # logged FILE CMD...: the command's output to the terminal and to FILE
    local file=$1
    shift
    if [ "$DRY" = 1 ]; then
        echo "gpu-check: would run: $* > $file"
        return
    fi
    mkdir -p "$(dirname "$file")"
    # in an `if`, so set -e does not end the script with the part (pipefail: the
    # pipeline fails with the command)
    if ! "$@" 2>&1 | tee "$file"; then
        FAILED+=("$part: $* (log: $file)")
    fi
}

# parabench compare A B: exit 1 says B is slower, a finding here, not a failure
compare() { "$PY" -m bench.cli compare "$@" || [ $? = 1 ]; }

for part in "${PARTS[@]}"; do
    echo "== gpu-check: $part -> $OUT" >&2
    UNPLANNED=
    case $part in
        install)
            "$PY" -c 'import importlib.metadata as m; m.version("parabench")' 2>/dev/null \
                || do_ "$PY" -m pip install --no-deps --no-build-isolation -e . ;;
        tests)
            if [ -n "${GPU_CHECK_TESTS:-}" ]; then  # some of them: a log of their own
                slug=$(printf '%s' "$GPU_CHECK_TESTS" | tr -cs 'A-Za-z0-9' '-')
                PARABENCH_TEST_DATA=$DATA logged "$OUT/test_gpu-${slug%-}.log" \
                    "$PY" -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider -k "$GPU_CHECK_TESTS"
            else
                PARABENCH_TEST_DATA=$DATA logged "$OUT/test_gpu.log" \
                    "$PY" -m pytest -q -ra tests/test_gpu.py -p no:cacheprovider
            fi ;;
        mnist)
            run --run-id mnist-device --dataset mnist --world-sizes 1,2 --repeats "$REPEATS" --data-path device \
                --oversubscribe
            run --run-id mnist-loader --dataset mnist --world-sizes 1 --repeats "$REPEATS" --data-path loader \
                --strategies single,ddp_torchrun
            run --run-id mnist-events --dataset mnist --world-sizes 1 --repeats "$REPEATS" --data-path device \
                --strategies single,ddp_torchrun --step-timing events
            logged "$OUT/compare-loader-device.txt" compare "$OUT/mnist-loader" "$OUT/mnist-device"
            logged "$OUT/compare-sync-events.txt" compare "$OUT/mnist-device" "$OUT/mnist-events" ;;
        resnet50)
            run --run-id resnet50 --dataset synthetic --model resnet50 --image-size 224 \
                --global-batch 256 --world-sizes 1 --max-steps 40 --warmup-steps 10 \
                --strategies single,ddp_torchrun,fsdp --precision fp32,bf16 --channels-last off,on ;;
        resnet50-all)
            # (apex, which trains in its own precision only, is a skipped row saying so);
            # then two ranks sharing the GPU over gloo, in a run of their own so the first's
            # figures are whole if the part is cut off (those that cannot share it: skipped
            # rows saying why)
            for ws in 1 2; do
                run --run-id "resnet50-strategies$([ $ws = 1 ] || echo -ws$ws)" --dataset synthetic \
                    --model resnet50 --image-size 224 --global-batch 256 --world-sizes $ws \
                    --max-steps 40 --warmup-steps 10 --precision bf16 --channels-last --oversubscribe
            done ;;
        compile)
            run --run-id resnet50-compile --dataset synthetic --model resnet50 --image-size 224 \
                --global-batch 256 --world-sizes 1 --max-steps 40 --warmup-steps 10 \
                --strategies single,ddp_torchrun --precision bf16 --channels-last --compile off,on
            # MNIST's 1.7 ms step is kernel launches: compiled, then captured as CUDA graphs
            run --run-id mnist-compile --dataset mnist --world-sizes 1 --repeats "$REPEATS" \
                --data-path device --strategies single,ddp_torchrun --compile off,on
            run --run-id mnist-cudagraphs --dataset mnist --world-sizes 1 --repeats "$REPEATS" \
                --data-path device --strategies single,ddp_torchrun --compile \
                --compile-mode reduce-overhead ;;
        overhead)
            # first, in two minutes, what the harness's loop adds to a step and its parts under
            # each timing (the paired rounds after it print it again, if not cut off)
            logged "$OUT/overhead/loop-cost.txt" "$PY" benchmarks/overhead.py --device cuda \
                --loop-cost-only
            for timing in sync events; do
                logged "$OUT/overhead/$timing.txt" "$PY" benchmarks/overhead.py --device cuda \
                    --data-root "$DATA" --max-minutes "$OVERHEAD_MINUTES" --step-timing "$timing" \
                    --csv "$OUT/overhead/$timing-rounds.csv"
            done ;;
        horovod)
            # after a failed build, run and verify each say in one line why horovod is
            # unavailable, and all three are named among the failed commands
            logged "$OUT/horovod/build.log" scripts/build_horovod.sh "$PY"
            [ "$DRY" != 1 ] || "$PY" -c 'import horovod.torch' 2>/dev/null \
                || UNPLANNED="Horovod does not import for $PY here; the part builds it first"
            run --run-id horovod --dataset mnist --world-sizes 1 --repeats "$REPEATS" \
                --strategies single,horovod,horovod_fp16
            verify --run-id horovod-verify --world-sizes 1 --strategies horovod,horovod_fp16 ;;
        apex)
            if [ "$DRY" != 1 ] && ! "$PY" -c 'import apex.amp, apex.parallel' 2>/dev/null; then
                echo "gpu-check: apex: NVIDIA apex with apex.amp (tag 25.05 or older) is not" \
                     "installed for $PY; apex_amp_ddp not run" >&2
                continue
            fi
            UNPLANNED="it needs CUDA"
            run --run-id apex --dataset mnist --world-sizes 1 --repeats "$REPEATS" \
                --strategies single,apex_amp_ddp --set opt_level=O1,O2
            verify --run-id apex-verify --world-sizes 1 --strategies apex_amp_ddp \
                --set opt_level=O1,O2 ;;
    esac
done
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "gpu-check: ${#FAILED[@]} command(s) failed; results so far in $OUT:" >&2
    printf '  %s\n' "${FAILED[@]}" >&2
    echo "gpu-check: GPU_CHECK_OUT=$OUT $0 PART... runs a part again into it (a cut-off" \
        "run is finished, not started anew)" >&2
    exit 1
fi
if [ "$DRY" = 1 ]; then
    echo "gpu-check: dry run, nothing run or written" >&2
else
    echo "gpu-check: results in $OUT" >&2
fi
