#!/bin/sh
# check_shipped_symbols.sh LIB... -- the shipped library holds no test-only
# code: no fake transport or network, no mutation switch, no test time scale
# (they live in kvpeer_testing, built with KVP_TESTING). Exit 1 naming what
# leaked.
set -u
bad=0
for lib in "$@"; do
    leaked=$(nm "$lib" 2>/dev/null | grep -i -E 'fake|mutat|kvp_test_' || true)
    if ! nm "$lib" 2>/dev/null | grep -q " T kvp_node_create$"; then
        echo "check_shipped_symbols: cannot read symbols of $lib (no kvp_node_create)"; bad=1
    elif [ -n "$leaked" ]; then
        echo "check_shipped_symbols: test-only symbols in $lib:"; echo "$leaked"; bad=1
    else
        echo "check_shipped_symbols: $lib: no test-only symbol"
    fi
done
exit $bad
