#!/bin/sh
# test_cli_expect_fail.sh CMD... -- runs `kvpeer demo ... --corrupt-one` and
# passes only if the demo's verdict is FAIL (exit 1) because of the corrupt
# block: proof that the verdict can fail.
set -u
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -ne 1 ]; then
    echo "test_cli_expect_fail: exit $rc, want 1 (FAIL verdict)"
    exit 1
fi
if ! grep -q "verdict *FAIL:.*no corrupt committed block" "$out"; then
    echo "test_cli_expect_fail: verdict did not fail on the corrupt block"
    exit 1
fi
if grep -q "verdict *FAIL:.*;" "$out"; then
    echo "test_cli_expect_fail: the verdict failed for other reasons too"
    exit 1
fi
echo "test_cli_expect_fail: FAIL verdict as expected"
exit 0
