#!/bin/sh
# install-py.sh -- the project venv (.venv/, git-ignored) for the vLLM tier's
# tests: vllm (pinned) and what its tiering framework needs to import on a
# CPU-only machine, all from PyPI. Idempotent: a stamp holding the pins'
# digest skips the install when nothing changed (a few ms).
#
# vllm is installed with --no-deps: its full requirement set pulls GPU kernel
# packages (flashinfer, cutlass-dsl, tilelang, ...) that the tiering framework
# never imports. python/requirements-vllm.txt lists the import closure with
# versions (also --no-deps, so the set is exactly that list).
# Measured on the project machine (46 MB/s to PyPI): ~2.5 min, 6.0 GB, mostly
# torch's CUDA libraries (PyPI has no CPU-only torch wheel for Linux).
# KVPEER_NO_VLLM=1 skips the install (the vLLM tests then skip, saying so).
set -eu
cd "$(dirname "$0")/.."
VLLM_VERSION=0.34.0
TORCH_VERSION=2.14.0   # vllm 0.34.0's pin
VENV=.venv
REQ=python/requirements-vllm.txt
if [ "${KVPEER_NO_VLLM:-0}" = 1 ]; then
    echo "install-py: KVPEER_NO_VLLM=1, vllm venv not installed"
    exit 0
fi
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
stamp="$VENV/.kvpeer-stamp"
want="vllm=$VLLM_VERSION torch=$TORCH_VERSION req=$(sha256sum "$REQ" | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
    exit 0
fi
t0=$(date +%s)
echo "install-py: creating $VENV (vllm $VLLM_VERSION, torch $TORCH_VERSION; ~6 GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps -r "$REQ" \
    "torch==$TORCH_VERSION" "vllm==$VLLM_VERSION"

"$VENV/bin/python" -c "import vllm.v1.kv_offload.tiering.spec" >/dev/null 2>&1 || {
    echo "install-py: vllm's tiering framework does not import:" >&2
    "$VENV/bin/python" -c "import vllm.v1.kv_offload.tiering.spec" >&2 || true
    exit 1
}
echo "$want" > "$stamp"
echo "install-py: done in $(( $(date +%s) - t0 )) s, $(du -sh "$VENV" | cut -f1)"
