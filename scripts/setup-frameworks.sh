#!/usr/bin/env bash
# Installs the framework suite's pinned wheels (tests/frameworks/requirements.txt: PyTorch 2.15 for CUDA 13.2
# with its nvidia-* libraries, CuPy, cuda-python, nvidia-ml-py, pytest — every one with its sha256) into
# .deps/venv, once. A later run finds the stamp of the same requirements file and does nothing, without
# network. About 3 GB to download, 4.7 GB on disk; pip's cache is not used.
#
#   scripts/setup-frameworks.sh           install if needed
#   scripts/setup-frameworks.sh --check   exit 1 (saying what to run) unless installed; never installs
#
# Needs Python 3.11 (the wheels are cp311): $CUQUOTA_FW_PYTHON, else python3.11, else python3 if it is 3.11.
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=tests/frameworks/requirements.txt
VENV=.deps/venv
STAMP="$VENV/.requirements.sha256"
MODULES='torch cupy cuda.bindings pynvml pytest numpy'

log() { echo "setup-frameworks: $*" >&2; }

installed() {
    [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$(sha256sum "$REQ" | cut -d' ' -f1)" ] &&
        "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in '$MODULES'.split()))" \
            2>/dev/null
}

if installed; then
    exit 0
fi
if [ "${1:-}" = --check ]; then
    log "the framework wheels are not installed in $VENV (or $REQ changed): run scripts/setup-frameworks.sh"
    exit 1
fi

PY="${CUQUOTA_FW_PYTHON:-}"
if [ -z "$PY" ]; then
    if command -v python3.11 >/dev/null; then PY=python3.11; else PY=python3; fi
fi
ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || { log "cannot run $PY"; exit 1; }
if [ "$ver" != 3.11 ]; then
    log "$PY is Python $ver; the pinned wheels are for 3.11: set CUQUOTA_FW_PYTHON to a Python 3.11"
    exit 1
fi

log "installing $(grep -c '==' "$REQ") pinned wheels into $VENV (once; ~3 GB download)"
rm -rf "$VENV"
"$PY" -m venv --without-pip "$VENV"
start=$(date +%s)
PIP_ROOT_USER_ACTION=ignore "$PY" -m pip --python "$VENV/bin/python" install --quiet --disable-pip-version-check \
    --no-cache-dir --no-deps --require-hashes --only-binary :all: -r "$REQ"
sha256sum "$REQ" | cut -d' ' -f1 >"$STAMP"
installed || { log "installed, but a module of '$MODULES' is still missing"; exit 1; }
log "done in $(($(date +%s) - start)) s: $(du -sh "$VENV" | cut -f1) in $VENV"
