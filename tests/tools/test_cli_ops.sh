#!/bin/sh
# test_cli_ops.sh KVPEER KVPEERD -- the operator commands against a real
# kvpeerd: `stat`, `held`, `peers` exit 0 and print the summary lines an
# operator relies on; after the node is gone they exit 1 with the connect
# error instead of hanging.
set -u
KVPEER=$1 KVPEERD=$2
SCALE=${KVPEER_TEST_TIME_SCALE:-1}
dir=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fails=0
check() { # check CODE PATTERN ARGS...
    code=$1 pat=$2
    shift 2
    "$KVPEER" "$@" >"$dir/out" 2>&1
    rc=$?
    if [ "$rc" -ne "$code" ] || ! grep -q -- "$pat" "$dir/out"; then
        echo "FAIL: kvpeer $* -> exit $rc (want $code), output must match '$pat':"
        cat "$dir/out"
        fails=$((fails + 1))
    else
        echo "ok: kvpeer $* -> $rc"
    fi
}

"$KVPEERD" --listen 127.0.0.1:0 --http 127.0.0.1:0 --ready-file "$dir/ready" \
    --num-blocks 64 --block-size 64K >"$dir/log" 2>&1 &
pid=$!
i=0
while [ ! -s "$dir/ready" ] && [ "$i" -lt $((300 * SCALE)) ]; do
    sleep 0.1
    i=$((i + 1))
done
http=$(sed -n 's/.*http=\([^ ]*\).*/\1/p' "$dir/ready")
if [ -z "$http" ]; then
    echo "FAIL: kvpeerd did not come up"; cat "$dir/log"; exit 1
fi
check 0 "node $http  up" stat "$http"
check 0 "slots     free 64  filling 0  ready 0  quarantined 0" stat "$http"
check 0 "held      retained 0  quarantined 0   force releases 0" stat "$http"
check 0 "(no peers)" stat "$http"
check 0 "0 retained transfer(s), 0 quarantined/suspect slot(s)" held "$http"
check 0 "force releases so far (items that reached the hold cap): 0" held --all "$http"
check 0 "(no peers)" peers "$http"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ "$rc" -eq 0 ] || { echo "FAIL: kvpeerd exit $rc on SIGTERM"; fails=$((fails + 1)); }
check 1 "connect" stat --timeout 2000 "$http"
exit $((fails > 0))
