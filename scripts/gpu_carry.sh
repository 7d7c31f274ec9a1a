#!/usr/bin/env bash
# Gather, on a machine with PyPI, what `make gpu-check` needs on a GPU machine that has no
# registry and no network, into git-ignored folders of this checkout that travel beside the
# working tree (a device tool's `carry`, or rsync):
#   .data/mnist                  MNIST, from $PARABENCH_DATA_ROOT or ../shared/data
#   .whl/horovod-0.28.1.tar.gz   Horovod's sdist; scripts/build_horovod.sh builds it there
#                                with NCCL and fetches nothing
# The GPU machine needs its own torch (with CUDA) and the project's other requirements
# installed (pandas, scipy, matplotlib, psutil, pytest): gpu-check installs only the
# project itself, from the working tree. NVIDIA apex is not gathered: see README.md.
#   scripts/gpu_carry.sh [PYTHON]        then name .data and .whl in the carry list
set -euo pipefail
# the one argument is a Python: an option here (--help) was run as one, after MNIST's copy
if [ $# -gt 1 ]; then
    echo "usage: $0 [PYTHON]   (gpu-carry: one argument, not $#)" >&2
    exit 2
fi
case "${1:-}" in
    -h | --help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "usage: $0 [PYTHON]   (gpu-carry: no option '$1')" >&2; exit 2 ;;
esac
# a Python given by a relative path is the caller's, as $PARABENCH_DATA_ROOT below
PY=${1:-${PYTHON:-}}
case "$PY" in
    */*) [[ "$PY" = /* ]] || PY="$PWD/$PY" ;;
esac
# a relative $PARABENCH_DATA_ROOT is the caller's, and ~ its home, as every parabench
# command reads it: made whole before the cd to the checkout below
SRC=${PARABENCH_DATA_ROOT:-}
case "$SRC" in
    "" | /*) ;;
    "~" | "~/"*) SRC="$HOME${SRC#"~"}" ;;
    *) SRC="$PWD/$SRC" ;;
esac
cd "$(dirname "$0")/.."
SRC=${SRC:-../shared/data}
PY=${PY:-.venv/bin/python}
HVD_VERSION=0.28.1
# said before MNIST's copy, where it was a "command not found" after it
if [ ! -f ".whl/horovod-$HVD_VERSION.tar.gz" ] && ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "gpu-carry: '$PY' cannot run pip, which fetches Horovod's sdist: pass a Python" \
         "that can (scripts/gpu_carry.sh PYTHON)" >&2
    exit 2
fi

if [ ! -d "$SRC/mnist" ]; then
    echo "gpu-carry: no MNIST under $SRC (set PARABENCH_DATA_ROOT to the folder holding mnist/)" >&2
    exit 2
fi
mkdir -p .data .whl
# .data may be a link to $SRC (git ignores a link there too): then .data/mnist is the
# source itself, and removing it before the copy would delete the only MNIST (a link
# .data/mnist is only a link: it is removed and replaced by a copy that travels)
if [ "$(cd .data && pwd -P)" = "$(cd "$SRC" && pwd -P)" ]; then
    echo "gpu-carry: .data/mnist is $SRC/mnist itself; left as it is (a carry that copies" \
         "a link as a link takes no MNIST: remove the link .data and run this again)" >&2
else
    # a copy an earlier run left read-only (before the chmod below) could not be emptied
    if [ -d .data/mnist ] && [ ! -L .data/mnist ]; then chmod -R u+w .data/mnist; fi
    rm -rf .data/mnist
    cp -r "$SRC/mnist" .data/mnist
    # a read-only source (a shared data folder) gives read-only folders, which the next
    # run's rm above could not empty, as anyone but root
    chmod -R u+w .data/mnist
fi

if [ ! -f ".whl/horovod-$HVD_VERSION.tar.gz" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d .whl \
        "horovod==$HVD_VERSION"
fi
tar -tzf ".whl/horovod-$HVD_VERSION.tar.gz" >/dev/null  # a whole archive, not a torn one

for d in .data .whl; do
    git check-ignore -q "$d" || { echo "gpu-carry: $d is not git-ignored here" >&2; exit 1; }
done
echo "gpu-carry: $(du -sh .data | cut -f1) in .data, $(du -sh .whl | cut -f1) in .whl;" \
     "carry both (64 MiB in all with the working tree)"
