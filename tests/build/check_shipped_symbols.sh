#!/bin/sh
# check_shipped_symbols.sh HEADER ALLOW DENY LIB... -- the shipped libraries
# (libkvpeer.so, libkvpeer.a) export the public API and nothing else, and
# hold no test-only code (issue 31). Exit 1 naming every offending symbol.
#
#   1. the .so's dynamic symbols are all declared in HEADER (kvpeer.h);
#   2. the .a's globals of default visibility are all declared in HEADER;
#   3. every other global of the .a matches a line of ALLOW (layer prefixes);
#   4. no symbol of either, global or local, is named in DENY or matches
#      fake|mutat|testscale|(^|_)test_ (the fake transport and network, the
#      mutation switch, the test time scale, test hooks: KVP_TESTING only).
set -u
header=$1 allow=$2 deny=$3
shift 3
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
# The public API: every kvp_ name that kvpeer.h declares as a function.
grep -o -E '\bkvp_[a-z0-9_]+ *\(' "$header" | sed -E 's/ *\($//' | sort -u >"$tmp/api"
grep -v -E '^(#|$)' "$allow" >"$tmp/allow"
grep -v -E '^(#|$)' "$deny" >"$tmp/deny"
bad=0
report() { # report LIB WHAT FILE
    if [ -s "$3" ]; then
        echo "check_shipped_symbols: $1: $2:"; sed 's/^/    /' "$3"; bad=1
    fi
}
for lib in "$@"; do
    if ! nm "$lib" 2>/dev/null | grep -q " T kvp_node_create$"; then
        echo "check_shipped_symbols: cannot read symbols of $lib (no kvp_node_create)"; bad=1
        continue
    fi
    case $lib in
    *.so*)
        nm -D --defined-only "$lib" | awk '{print $3}' | sort -u >"$tmp/exported"
        ;;
    *)
        readelf -sW "$lib" | awk '($5=="GLOBAL"||$5=="WEAK") && $6=="DEFAULT" && $7!="UND" && $8!="" {print $8}' |
            sort -u >"$tmp/exported"
        nm --defined-only "$lib" 2>/dev/null | awk 'NF==3 && $2 ~ /^[A-Z]$/ {print $3}' | sort -u |
            grep -v -x -F -f "$tmp/api" | grep -v -E -f "$tmp/allow" >"$tmp/unlisted" || true
        report "$lib" "non-API globals outside the allow list ($allow)" "$tmp/unlisted"
        ;;
    esac
    grep -v -x -F -f "$tmp/api" "$tmp/exported" >"$tmp/notapi" || true
    report "$lib" "exported but not declared in $header" "$tmp/notapi"
    nm -a "$lib" 2>/dev/null | awk 'NF==3 {print $3} NF==2 {print $2}' | sort -u >"$tmp/all"
    { grep -x -F -f "$tmp/deny" "$tmp/all"; grep -i -E 'fake|mutat|testscale|(^|_)test_' "$tmp/all"; } |
        sort -u >"$tmp/testonly" || true
    report "$lib" "test-only symbols" "$tmp/testonly"
    [ $bad -eq 0 ] && echo "check_shipped_symbols: $lib: $(wc -l <"$tmp/exported") exported, all in the API; no test-only symbol"
done
exit $bad
