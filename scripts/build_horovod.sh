#!/usr/bin/env bash
# Build (or reuse a cached build of) Horovod for the given Python/venv.
#
# Usage: scripts/build_horovod.sh PYTHON        (e.g. .venv/bin/python)
#
# Horovod 0.28.1 is the last release and its sdist hard-codes C++14, while
# recent torch headers need C++17/C++20.  So we download the sdist, raise the
# C++ standard in its CMake files, and build a wheel against the installed torch:
#   - CPU machine (torch.cuda.is_available() is False): CPU-only Gloo build.
#   - GPU machine: Gloo + NCCL build (HOROVOD_GPU_OPERATIONS=NCCL).
# Wheels are cached in ${PARABENCH_CACHE:-~/.cache/parabench}/wheels/<key>/.
#
# Environment knobs (all optional):
#   PARABENCH_CACHE              cache root (default ~/.cache/parabench)
#   PARABENCH_HOROVOD_VARIANT    force "cpu" or "nccl" instead of auto-detecting
#   PARABENCH_HOROVOD_JOBS       parallel compile jobs (default: min(nproc, 8))
#   PARABENCH_KEEP_BUILD=1       keep the temporary build dir
#   HOROVOD_BUILD_CUDA_CC_LIST   nccl variant: compute capabilities for the CUDA
#                                kernels (default: those of the visible GPUs)
set -euo pipefail

HVD_VERSION=0.28.1
PREFIX="[build_horovod]"

log() { echo "$PREFIX $*"; }
die() { echo "$PREFIX ERROR: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 PYTHON   (e.g. .venv/bin/python)"

# Absolute path to the interpreter *without* resolving the venv's symlink.
PY=$1
if [[ "$PY" == */* ]]; then
    [[ -f "$PY" && -x "$PY" ]] || die "python interpreter '$PY' not found or not executable"
    PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
else
    PY=$(command -v "$PY") || die "python interpreter '$1' not found in PATH"
fi
PY_BIN_DIR=$(dirname "$PY")

export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_() { "$PY" -m pip "$@"; }

# Runtime requirements of horovod (install_requires of 0.28.1, without torch).
RUNTIME_REQS=(cloudpickle psutil pyyaml packaging)
# Extra requirements for building the wheel with --no-build-isolation.
BUILD_REQS=(setuptools wheel)

# Those of the named distributions that are not installed: pip is asked for these alone, so
# a machine with no registry that already has them all asks for nothing.
missing() {
    "$PY" -c '
import importlib.metadata as m, sys
def has(name):
    try:
        m.distribution(name)
        return True
    except m.PackageNotFoundError:
        return False
print(" ".join(n for n in sys.argv[1:] if not has(n)))' "$@"
}
# pip install of what is missing of "$@"; a no-op when nothing is.
install_missing() {
    local need
    need=$(missing "$@") || return 1
    [[ -z "$need" ]] && return 0
    log "installing $need"
    # shellcheck disable=SC2086
    pip_ install -q $need >>"$LOG" 2>&1
}

verify_import() {
    # Checks: version, the torch extension loads, and hvd.init() works (size 1).
    timeout 120 "$PY" -c "
import horovod, horovod.torch as hvd
assert horovod.__version__ == '$HVD_VERSION', horovod.__version__
hvd.init()
print('horovod', horovod.__version__, 'size', hvd.size(), 'gloo', hvd.gloo_built(), 'nccl', hvd.nccl_built(), 'mpi', hvd.mpi_built())
hvd.shutdown()
" 2>&1
}

# ---------------------------------------------------------------- 1. installed?
# Installed, importable against this torch, and of the wanted variant (an NCCL build on a
# GPU machine: a CPU build there would leave the horovod strategies unavailable).
if PARABENCH_HOROVOD_VARIANT=${PARABENCH_HOROVOD_VARIANT:-} "$PY" -c "
import os, sys, torch, horovod, horovod.torch as hvd
want = os.environ['PARABENCH_HOROVOD_VARIANT'] or ('nccl' if torch.cuda.is_available() else 'cpu')
sys.exit(horovod.__version__ != '$HVD_VERSION' or (want == 'nccl' and not hvd.nccl_built()))
" >/dev/null 2>&1; then
    log "horovod $HVD_VERSION with torch support is already installed for $PY; nothing to do"
    exit 0
fi

# ---------------------------------------------------------------- 2. cache key
TORCH_INFO=$("$PY" -c "
import sys, torch
print(torch.__version__)
print('cp%d%d' % sys.version_info[:2])
print('nccl' if torch.cuda.is_available() else 'cpu')
" 2>/dev/null) || die "cannot import torch with $PY (install torch into the venv first)"
TORCH_VERSION=$(sed -n 1p <<<"$TORCH_INFO")
PY_TAG=$(sed -n 2p <<<"$TORCH_INFO")
VARIANT=${PARABENCH_HOROVOD_VARIANT:-$(sed -n 3p <<<"$TORCH_INFO")}
case "$VARIANT" in
    cpu|nccl) ;;
    *) die "PARABENCH_HOROVOD_VARIANT must be 'cpu' or 'nccl', got '$VARIANT'" ;;
esac

CC_LIST=""
if [[ "$VARIANT" == nccl ]]; then
    CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-$("$PY" -c "
import torch
ccs = sorted({'%d%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
print(','.join(ccs))
" 2>/dev/null || true)}
fi

KEY="horovod-${HVD_VERSION}-torch${TORCH_VERSION}-${PY_TAG}-$(uname -m)-${VARIANT}${CC_LIST:+-sm${CC_LIST//,/_}}"
CACHE_ROOT=${PARABENCH_CACHE:-$HOME/.cache/parabench}
CACHE_DIR="$CACHE_ROOT/wheels/$KEY"
LOG_DIR="$CACHE_ROOT/logs"
LOG="$LOG_DIR/$KEY.log"
mkdir -p "$CACHE_DIR" "$LOG_DIR"
log "cache key: $KEY"

# Serialise concurrent builds of the same key.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_DIR/.lock"
    flock 9
fi

install_wheel() {
    local whl=$1
    install_missing "${RUNTIME_REQS[@]}" \
        || { tail -n 30 "$LOG" >&2; die "pip install of horovod runtime requirements failed (log: $LOG)"; }
    log "installing $(basename "$whl")"
    pip_ install -q --no-deps --force-reinstall "$whl" >>"$LOG" 2>&1 \
        || { tail -n 30 "$LOG" >&2; die "pip install of $whl failed (log: $LOG)"; }
    local out
    if ! out=$(verify_import); then
        echo "$out" | tail -n 30 >&2
        die "horovod installed from $whl but 'import horovod.torch; hvd.init()' fails"
    fi
    log "verified: $(tail -n 1 <<<"$out")"
}

# ---------------------------------------------------------------- 3. cached wheel?
shopt -s nullglob
cached=("$CACHE_DIR"/horovod-"$HVD_VERSION"-*.whl)
shopt -u nullglob
if [[ ${#cached[@]} -gt 0 ]]; then
    LOG="$LOG_DIR/$KEY.install.log"   # keep the build log of the cached wheel
    : >"$LOG"
    log "using cached wheel ${cached[0]}"
    install_wheel "${cached[0]}"
    exit 0
fi

# ---------------------------------------------------------------- 4. build
: >"$LOG"
log "no cached wheel; building horovod $HVD_VERSION ($VARIANT) from source, log: $LOG"
fail() {
    if grep -qE 'CMake Error|error:|Error [0-9]+|ERROR: (No matching|Could not)' "$LOG" 2>/dev/null; then
        echo "$PREFIX ---- first error lines in $LOG ----" >&2
        grep -E -m 15 -A 3 'CMake Error|error:|Error [0-9]+|ERROR: (No matching|Could not)' "$LOG" | cut -c1-400 >&2 || true
    fi
    echo "$PREFIX ---- last 40 lines of $LOG ----" >&2
    tail -n 40 "$LOG" | cut -c1-400 >&2
    echo "$PREFIX ----" >&2
    die "$* (full log: $LOG)"
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/parabench-horovod.XXXXXX")
if [[ "${PARABENCH_KEEP_BUILD:-0}" == 1 ]]; then
    log "keeping build dir $WORK"
else
    trap 'rm -rf "$WORK"' EXIT
fi

command -v cmake >/dev/null 2>&1 || die "cmake not found in PATH (need cmake >= 3.13)"
command -v "${CXX:-g++}" >/dev/null 2>&1 || die "C++ compiler '${CXX:-g++}' not found"
if [[ "$VARIANT" == nccl && ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]]; then
    # horovod's CMake compiles its CUDA kernels with $HOROVOD_CUDA_HOME/bin/nvcc (torch's
    # wheels carry no nvcc): take the toolkit of the nvcc on PATH, or say there is none
    NVCC=$(command -v nvcc) || die "nccl variant: no nvcc in ${CUDA_HOME:-/usr/local/cuda}/bin" \
        "or on PATH; install the CUDA toolkit or set CUDA_HOME to it"
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
    log "CUDA toolkit: $CUDA_HOME (from the nvcc on PATH)"
fi
# the tools first: a machine that cannot build gets its one line before pip installs anything
install_missing "${BUILD_REQS[@]}" "${RUNTIME_REQS[@]}" \
    || fail "pip install of build requirements failed"

SDIST=${PARABENCH_HOROVOD_SDIST:-}
CARRIED="$(cd "$(dirname "$0")/.." && pwd)/.whl/horovod-$HVD_VERSION.tar.gz"
[[ -z "$SDIST" && -f "$CARRIED" ]] && SDIST=$CARRIED
if [[ -n "$SDIST" ]]; then
    [[ -f "$SDIST" ]] || fail "PARABENCH_HOROVOD_SDIST=$SDIST: no such file"
    log "building from the sdist $SDIST (nothing downloaded)"
else
    log "downloading horovod==$HVD_VERSION sdist"
    pip_ download -q --no-deps --no-binary :all: --no-build-isolation -d "$WORK/dl" "horovod==$HVD_VERSION" >>"$LOG" 2>&1 \
        || fail "pip download of the horovod $HVD_VERSION sdist failed (offline? carry it: PARABENCH_HOROVOD_SDIST=path/horovod-$HVD_VERSION.tar.gz)"
    SDIST=$(ls "$WORK"/dl/horovod-"$HVD_VERSION".tar.gz 2>/dev/null) || fail "sdist not found after download"
fi
tar -xzf "$SDIST" -C "$WORK" || fail "cannot unpack $SDIST"
SRC="$WORK/horovod-$HVD_VERSION"

# C++ standard required by the installed torch's headers/CMake config.
CXX_STD=$("$PY" - <<'EOF' 2>>"$LOG"
import os, re, torch
root = os.path.dirname(torch.__file__)
std = 17  # torch >= 2.1 needs C++17 (horovod's default 14 is too old)
cands = [os.path.join(root, "share/cmake/Torch/TorchConfig.cmake"),
         os.path.join(root, "include/torch/csrc/api/include/torch/all.h")]
for f in cands:
    try:
        txt = open(f, errors="replace").read()
    except OSError:
        continue
    if re.search(r"cxx_std_20|C\+\+20 or later|__cplusplus < 202002L", txt):
        std = 20
    elif std < 17 and re.search(r"cxx_std_17|C\+\+17", txt):
        std = 17
print(std)
EOF
) || fail "cannot determine the C++ standard torch needs"
log "torch $TORCH_VERSION needs C++$CXX_STD; patching horovod CMake files (C++14 -> C++$CXX_STD)"
sed -i "s/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD $CXX_STD)/" \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
grep -q "set(CMAKE_CXX_STANDARD $CXX_STD)" "$SRC/horovod/torch/CMakeLists.txt" \
    || fail "patching the C++ standard in horovod/torch/CMakeLists.txt failed"
# horovod builds RelWithDebInfo (-O3 -g after its own edit): the same code without the
# debug information, which torch's headers make costly to emit
sed -i 's/^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO .*$/&\nstring(REGEX REPLACE "(^| )-g( |$)" " " CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")/' \
    "$SRC/CMakeLists.txt"
grep -qF 'string(REGEX REPLACE "(^| )-g( |$)"' "$SRC/CMakeLists.txt" \
    || fail "dropping -g from horovod's CMakeLists.txt failed"

# setup.py has setuptools fetch cffi while it builds (setup_requires), a leftover of the old
# cffi-based torch extension: 0.28.1's is C++ and imports no cffi. With no registry (a GPU
# machine lent offline) that fetch fails the whole build, so the requirement is dropped.
sed -i "s/^\( *\)require_list.append('cffi>=1.4.0')$/\1pass  # cffi: not needed (parabench)/" "$SRC/setup.py"
grep -q "require_list.append('cffi" "$SRC/setup.py" \
    && fail "dropping cffi from horovod's setup.py (setup_requires) failed"

BUILD_ENV=(
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1
    HOROVOD_CPU_OPERATIONS=gloo
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    MAKEFLAGS="-j${PARABENCH_HOROVOD_JOBS:-$(( $(nproc) < 8 ? $(nproc) : 8 ))}"
    # CMake 4 refuses the cmake_minimum_required(< 3.5) of the bundled gloo and friends
    # ("Compatibility with CMake < 3.5 has been removed"); this lets it configure them
    CMAKE_POLICY_VERSION_MINIMUM=3.5
    # g++ 13 and newer no longer pull <string> and <stdexcept> in through other headers,
    # and horovod/common's group_table.h and common.h rely on that
    "CXXFLAGS=${CXXFLAGS:-} -include string -include stdexcept"
)
if [[ "$VARIANT" == cpu ]]; then
    # torch is a CUDA build and CUDA_HOME exists, so horovod would otherwise
    # compile its CUDA kernels with nvcc.  Make it see a CPU-only torch.
    sed -i 's/print(True if ((torch.version.cuda is not None) and (CUDA_HOME is not None)) else False)/print(False)/' \
        "$SRC/cmake/Modules/FindPytorch.cmake"
    grep -q 'import torch; from torch.utils.cpp_extension import CUDA_HOME; print(False)' \
        "$SRC/cmake/Modules/FindPytorch.cmake" || fail "patching FindPytorch.cmake for a CPU-only build failed"
    unset HOROVOD_GPU HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER \
          HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER
else
    BUILD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=${CUDA_HOME:-/usr/local/cuda})
    [[ -n "$CC_LIST" ]] && BUILD_ENV+=(HOROVOD_BUILD_CUDA_CC_LIST="$CC_LIST")
    # nvcc >= 12 dropped C++11; the kernels only need a modern standard.
    sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$SRC/horovod/common/ops/cuda/CMakeLists.txt"
    # Use the NCCL that ships with torch (nvidia-nccl-cu* wheel) unless one is given.
    if [[ -z "${HOROVOD_NCCL_HOME:-}${HOROVOD_NCCL_INCLUDE:-}" ]] && [[ ! -e /usr/include/nccl.h ]]; then
        NCCL_PKG=$("$PY" -c "import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null) \
            || fail "nccl variant: no system NCCL and no nvidia-nccl python package; set HOROVOD_NCCL_HOME"
        mkdir -p "$WORK/nccl-lib"
        ln -sf "$NCCL_PKG/lib/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
        BUILD_ENV+=(HOROVOD_NCCL_INCLUDE="$NCCL_PKG/include" HOROVOD_NCCL_LIB="$WORK/nccl-lib" HOROVOD_NCCL_LINK=SHARED)
    fi
fi

log "building wheel (${BUILD_ENV[*]}); this takes several minutes"
start=$SECONDS
( cd "$SRC" && env "${BUILD_ENV[@]}" PATH="$PY_BIN_DIR:$PATH" \
    "$PY" -m pip wheel -v --no-build-isolation --no-deps -w "$WORK/wheel" . ) >>"$LOG" 2>&1 \
    || fail "building the horovod wheel failed after $((SECONDS - start))s"
WHL=$(ls "$WORK"/wheel/horovod-"$HVD_VERSION"-*.whl 2>/dev/null | head -n 1)
[[ -n "$WHL" ]] || fail "pip wheel succeeded but produced no horovod wheel"
log "built $(basename "$WHL") in $((SECONDS - start))s"

cp "$WHL" "$CACHE_DIR/.$(basename "$WHL").tmp"
mv "$CACHE_DIR/.$(basename "$WHL").tmp" "$CACHE_DIR/$(basename "$WHL")"
log "cached wheel in $CACHE_DIR"

install_wheel "$CACHE_DIR/$(basename "$WHL")"
log "done"
