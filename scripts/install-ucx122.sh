#!/bin/sh
# install-ucx122.sh -- UCX 1.22 from PyPI (libucx-cu12: headers, libraries,
# pkg-config files, ucx_info; runs without a GPU) in a venv under build/, for
# the second build of kvpeer beside Debian's UCX 1.13 (issue 30, `make
# ucx122`). Idempotent: a stamp holding the version skips everything (a few
# ms). Prints nothing else on success but the pkg-config directory to use:
#   PKG_CONFIG_PATH=$(scripts/install-ucx122.sh) cmake ...
#
# The wheel's .pc files name the prefix of the wheel's own build machine
# (/__w/ucx-wheels/...): copies with the real prefix go to $UCX122_PC (the
# venv stays as pip left it). Its ucx_info carries a RUNPATH to that same
# missing prefix, so without LD_LIBRARY_PATH it loads whatever libucp the
# system has (Debian's 1.13): the check below sets it. The libraries find
# each other ($ORIGIN) and UCX finds its modules (uct_cma, ...) in lib/ucx
# next to libucs, so no UCX_MODULE_DIR is needed.
set -eu
cd "$(dirname "$0")/.."
UCX122_VERSION=${UCX122_VERSION:-1.22.0}
VENV=${UCX122_VENV:-build/ucx122-venv}
PC=${UCX122_PC:-build/ucx122-pkgconfig}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
stamp="$VENV/.kvpeer-ucx-stamp"
want="libucx-cu12=$UCX122_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$PC/ucx.pc" ]; then
    readlink -f "$PC"
    exit 0
fi
t0=$(date +%s)
echo "install-ucx122: libucx-cu12==$UCX122_VERSION into $VENV" >&2
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check --progress-bar off \
    "libucx-cu12==$UCX122_VERSION" >&2
root=$("$VENV/bin/python" -c 'import os, libucx; print(os.path.dirname(os.path.abspath(libucx.__file__)))')
[ -f "$root/lib/pkgconfig/ucx.pc" ] || { echo "install-ucx122: no ucx.pc under $root" >&2; exit 1; }

mkdir -p "$PC"
for f in "$root"/lib/pkgconfig/*.pc; do
    sed "s|^prefix *=.*|prefix=$root|" "$f" > "$PC/$(basename "$f")"
done
# What the build will see, and that this UCX loads and runs here (no GPU).
got=$(PKG_CONFIG_PATH="$(readlink -f "$PC")" pkg-config --modversion ucx)
lib=$(PKG_CONFIG_PATH="$(readlink -f "$PC")" pkg-config --variable=libdir ucx)
[ "$got" = "$UCX122_VERSION" ] && [ -f "$lib/libucp.so.0" ] || {
    echo "install-ucx122: pkg-config says ucx $got, libdir $lib: not the wheel's $UCX122_VERSION" >&2
    exit 1
}
LD_LIBRARY_PATH="$lib" "$root/bin/ucx_info" -v > "$PC/ucx_info-v.txt"
grep -q "Library version: $UCX122_VERSION" "$PC/ucx_info-v.txt" || {
    echo "install-ucx122: ucx_info -v does not report $UCX122_VERSION:" >&2
    cat "$PC/ucx_info-v.txt" >&2
    exit 1
}
echo "$want" > "$stamp"
echo "install-ucx122: UCX $got in $lib (pkg-config: $PC), $(( $(date +%s) - t0 )) s" >&2
readlink -f "$PC"
