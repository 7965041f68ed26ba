#!/bin/sh
# sim_mutations.sh SIM [SEEDS] -- the mutation table of issue 15: for every
# mutation switch the simulator can see, the first seed (of 1..SEEDS, 600
# steps) whose run reports a violation. Fails if one survives. The two
# switches that need a forged frame or a write landing past the hold cap are
# proven by directed tests (test_mutations); they are listed as such.
set -u
sim=$1
seeds=${2:-2000}
fail=0
printf '%-28s %s\n' "mutation" "first seed caught (of $seeds)"
for m in 1 2 3 6; do
    out=$("$sim" --mutation "$m" --until-caught --first 1 --seeds "$seeds" --steps 600 --jobs 2 2>/dev/null)
    name=$(printf '%s\n' "$out" | sed -n 's/.*mutation \([a-z-]*\)$/\1/p' | head -1)
    first=$(printf '%s\n' "$out" | sed -n 's/.*first seed with one: \([0-9]*\).*/\1/p')
    if [ -z "$first" ]; then
        printf '%-28s SURVIVED %s seeds\n' "$name" "$seeds"
        fail=1
    else
        printf '%-28s %s\n' "$name" "$first"
    fi
done
printf '%-28s %s\n' "accept-stale-epoch" "directed: test_mutations (forged ABORT_ACK)"
printf '%-28s %s\n' "skip-suspect-verify" "directed: test_mutations (write past the cap)"
exit $fail
