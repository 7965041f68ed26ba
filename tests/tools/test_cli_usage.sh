#!/bin/sh
# test_cli_usage.sh KVPEER -- the CLI's usage contract: --help on the top
# level and on every command exits 0 and prints a usage line; a bad flag, a
# missing argument or an unknown command exits 2 with a message naming it.
set -u
KVPEER=$1
fails=0
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

expect() { # expect CODE PATTERN-IN-OUTPUT ARGS...
    code=$1 pat=$2
    shift 2
    "$KVPEER" "$@" >"$out" 2>"$err"
    rc=$?
    if [ "$rc" -ne "$code" ] || ! cat "$out" "$err" | grep -q -- "$pat"; then
        echo "FAIL: kvpeer $* -> exit $rc (want $code), output must match '$pat':"
        cat "$out" "$err"
        fails=$((fails + 1))
    else
        echo "ok: kvpeer $* -> $rc"
    fi
}

expect 0 "usage: kvpeer <command>" --help
expect 2 "usage: kvpeer <command>"
expect 2 "unknown command 'frobnicate'" frobnicate
for c in demo bench stat held peers; do
    expect 0 "usage: kvpeer $c" "$c" --help
    expect 2 "unknown or incomplete flag '--no-such-flag'" "$c" --no-such-flag
done
expect 2 "bad --blocks" demo --blocks nope
expect 2 "bad --block-size" demo --block-size 1000
expect 2 "unexpected argument 'extra'" demo extra
expect 2 "exactly one HOST:PORT" stat
expect 2 "bad address 'nocolon'" held nocolon
expect 2 "bad --timeout" peers --timeout 0 127.0.0.1:1
# an address nobody listens on: a clear error and exit 1, not a hang
expect 2 "unknown or incomplete flag '--all'" stat --all 127.0.0.1:1
expect 2 "bad --runs" bench --runs 0
expect 2 "bad --path" bench --path ib
expect 1 "connect" stat --timeout 2000 127.0.0.1:1
expect 1 "connect" held --all 127.0.0.1:1
expect 1 "connect" peers 127.0.0.1:1
exit $((fails > 0))
