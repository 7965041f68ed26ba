#!/bin/sh
# sim_mutations.sh SIM [SEEDS] -- the mutation table of issue 15: for every
# mutation switch, the first seed (of 1..SEEDS, 600 steps, default workload)
# whose run reports a violation. Fails if one survives. (test_mutations also
# proves accept-stale-epoch and skip-suspect-verify with directed scenarios.)
# 9, exit-proof-alive (issue 27): the process-exit proof given while the
# source still runs (also test_node_fence test_exit_proof_not_while_source_runs).
set -u
sim=$1
seeds=${2:-2000}
fail=0
printf '%-28s %s\n' "mutation" "first seed caught (of $seeds)"
# try MODE_LABEL SWITCH [SIM FLAGS...]: the first seed that reports a violation.
try() {
    label=$1 m=$2
    shift 2
    out=$("$sim" "$@" --mutation "$m" --until-caught --first 1 --seeds "$seeds" --steps 600 --jobs 2 2>/dev/null)
    name=$(printf '%s\n' "$out" | sed -n 's/.*mutation \([a-z-]*\)$/\1/p' | head -1)
    first=$(printf '%s\n' "$out" | sed -n 's/.*first seed with one: \([0-9]*\).*/\1/p')
    if [ -z "$first" ]; then
        printf '%-28s SURVIVED %s seeds%s\n' "$name" "$seeds" "$label"
        fail=1
    else
        printf '%-28s %s%s\n' "$name" "$first" "$label"
    fi
}
for m in 1 2 3 4 5 6 9; do
    try "" "$m"
done
# Issue 29: external-slots mode (every node's region the embedding's): its own
# switches and the teardown ones.
for m in 10 11 1 2 3 6; do
    try " (external)" "$m" --external
done
# Issue 29 step 2: keys wanted (the embedding answers KVP_EV_WANTED).
try " (wanted)" 12 --external --wanted
exit $fail
