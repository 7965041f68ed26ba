#!/usr/bin/env bash
# run-fuzz.sh <builddir> <seconds>
#
# Runs every libFuzzer target found under <builddir>/fuzz/*/ for <seconds>
# each. The seed corpus of fuzz/<layer>/corpus/ in the source tree is copied
# to a scratch directory under the build dir (<builddir>/fuzz-run/<target>/),
# so the fuzzer's new inputs and crash artifacts never touch the tree.
# Prints "<target>: N execs, M crashes" per target; exits non-zero if any
# target crashed (or no target was found).
set -u

if [ $# -ne 2 ]; then
    echo "usage: $0 <builddir> <seconds>" >&2
    exit 2
fi
build=$(cd "$1" && pwd) || exit 2
secs=$2
src=$(cd "$(dirname "$0")/.." && pwd)

found=0
failed=0
for target in "$build"/fuzz/*/*; do
    [ -f "$target" ] && [ -x "$target" ] || continue
    name=$(basename "$target")
    layer=$(basename "$(dirname "$target")")
    found=$((found + 1))

    work="$build/fuzz-run/$name"
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/artifacts"
    if [ -d "$src/fuzz/$layer/corpus" ]; then
        cp -r "$src/fuzz/$layer/corpus/." "$work/corpus/"
    fi

    "$target" "$work/corpus" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/artifacts/" >"$work/log" 2>&1
    rc=$?

    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1)
    [ -n "$execs" ] || execs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$work/log" | tail -n 1)
    [ -n "$execs" ] || execs=0
    crashes=$(find "$work/artifacts" -type f | wc -l)
    if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then
        crashes=1 # died without writing an artifact (e.g. a sanitizer abort in init)
    fi
    echo "$name: $execs execs, $crashes crashes"
    if [ "$crashes" -ne 0 ]; then
        failed=1
        echo "  log: $work/log" >&2
        tail -n 30 "$work/log" >&2
        find "$work/artifacts" -type f -exec echo "  artifact: {}" \; >&2
    fi
done

if [ "$found" -eq 0 ]; then
    echo "run-fuzz: no fuzz targets under $build/fuzz/*/" >&2
    exit 1
fi
exit "$failed"
