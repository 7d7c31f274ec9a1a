#!/usr/bin/env bash
# The test suite against another torch than constraints.txt's:
#   scripts/test_torch.sh VERSION [PYTEST ARGS ...]      (make test-torch TORCH=VERSION)
# Makes .venv-torch-VERSION once: torch==VERSION with the torchvision pip resolves for it,
# the packages constraints.txt pins at their versions, the test tools, this project
# editable without its dependencies. Then runs pytest there: by default the fast suite (-m "not slow"). Horovod
# is not built in it, so its tests skip. README's "Which torch" says what this found.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 && $1 =~ ^[0-9]+\.[0-9]+(\.[0-9]+)?(\+[A-Za-z0-9.]+)?$ ]] || {
    echo "usage: $0 TORCH_VERSION [PYTEST ARGS ...]   (e.g. $0 2.11.0)" >&2
    exit 2
}
VERSION=$1
shift
VENV=.venv-torch-$VERSION
PY=$VENV/bin/python
if [[ ! -f $VENV/.installed ]]; then
    rm -rf "$VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip setuptools wheel
    # torchvision pins the torch it was built for: pip picks the one that matches VERSION
    grep -vE '^(torch|torchvision)==' constraints.txt >"$VENV/constraints.txt"
    "$PY" -m pip install -q -c "$VENV/constraints.txt" "torch==$VERSION" torchvision \
        numpy pandas scipy matplotlib psutil pillow tqdm \
        pytest pytest-timeout pytest-benchmark nbformat nbclient ipykernel
    "$PY" -m pip install -q --no-deps --no-build-isolation -e .
    touch "$VENV/.installed"
fi
"$PY" -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__)'
[[ $# -gt 0 ]] || set -- -m "not slow"
# the subprocesses the tests start (torchrun, workers) find this venv's python first
PATH="$PWD/$VENV/bin:$PATH" exec "$PY" -m pytest -q -ra -p no:cacheprovider "$@"
