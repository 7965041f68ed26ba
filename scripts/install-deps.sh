#!/bin/sh
# install-deps.sh -- idempotent install of exactly what kvpeer needs (Debian 12).
set -eu
PKGS="libucx-dev ucx-utils libxxhash-dev libcmocka-dev libsodium-dev libmicrohttpd-dev libinih-dev libcurl4-openssl-dev
libzmq3-dev libmsgpack-dev python3-zmq python3-msgpack
pkg-config cmake make gcc clang libclang-rt-14-dev valgrind gnuplot-nox python3 python3-pytest python3-setuptools python3-pip python3-venv
iproute2 procps"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "install-deps: installing:$missing"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# The project venv (vllm for the vLLM tier's tests), from PyPI.
"$(dirname "$0")/install-py.sh"
