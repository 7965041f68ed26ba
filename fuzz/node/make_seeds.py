#!/usr/bin/env python3
"""Write the seed corpus of the session fuzzer (fuzz/node/corpus/).

Each seed is byte 0 = configuration, then ops (see fuzz_session_run.c:
opcode byte, then its argument bytes). The seeds walk the main flows so the
fuzzer starts from deep states: node as source (lookup, fetch, abort,
finish), node as consumer (lookup, fetch, honest writes, FETCH_DONE,
ABORT_ACK), kills and partitions mid-transfer, stale epochs after a
reconnect, wedged transfers past the hold cap, limits.
Usage: make_seeds.py [outdir]   (default: the corpus/ next to this file)
"""
import os
import sys

(P_LOOKUP, P_FETCH, P_ABORT, P_DONE, P_ACK, P_RESP, P_WRITE, P_BYE, EPOCH, ADV, TICK,
 N_PUT, N_GET, N_LOOKUP, N_FETCH, N_CANCEL, N_FINISH, N_SCRIPT, KILL, N_PEER, N_EPERR,
 PING) = range(22)

FENCE, UNFENCE, SMALL = 0, 1, 2


def puts(keys, req=0):
    return [b for k in keys for b in (N_PUT, k, req)]


def p_lookup(req, rnd, keys):
    return [P_LOOKUP, req, rnd, len(keys)] + keys


def p_fetch(req, rnd, items, flags=0):
    """items: (key, gen, slot); slot >= 240 means out of range."""
    out = [P_FETCH, req, rnd, flags, len(items)] + [k for k, _, _ in items]
    for _, g, s in items:
        out += [g, s]
    return out


def n_lookup(req, keys):
    return [N_LOOKUP, req, 0, len(keys) - 1] + keys


def n_fetch(req, keys, flags=0):
    return [N_FETCH, req, flags, len(keys) - 1] + keys


def done(pick, status=0, n=0, ok=0xff, bad=0):
    return [P_DONE, pick, status, n, ok, bad]


def resp(pick, results):
    return [P_RESP, pick, 0] + results


SEEDS = {
    # node as source
    "src_fetch_ok": [FENCE] + puts([0, 1, 2]) + p_lookup(1, 1, [0, 1, 2]) + [TICK, 10]
    + p_fetch(1, 1, [(0, 1, 0), (1, 1, 1), (2, 1, 2)]) + [ADV, 5] + p_fetch(1, 0, []),
    "src_fetch_unsupplied": [FENCE] + puts([0]) + p_fetch(1, 1, [(0, 1, 0), (5, 1, 1)]),
    "src_wait_for_supply": [FENCE] + p_fetch(2, 1, [(3, 1, 4)], flags=1) + [TICK, 5]
    + [N_PUT, 3, 2] + [ADV, 5],
    "src_wait_then_finish": [FENCE] + p_fetch(2, 1, [(3, 1, 4)], flags=1) + [TICK, 5]
    + p_fetch(2, 0, []) + [ADV, 50],
    "src_abort_wedged": [FENCE] + puts([0, 1]) + p_lookup(1, 1, [0, 1]) + [N_SCRIPT, 0, 0]
    + p_fetch(1, 1, [(0, 1, 0), (1, 1, 1)]) + [TICK, 5, P_ABORT, 0, ADV, 30, P_ABORT, 0],
    "src_kill_wedged": [FENCE] + puts([0, 1]) + p_lookup(1, 1, [0, 1]) + [N_SCRIPT, 0, 0]
    + p_fetch(1, 1, [(0, 1, 0), (1, 1, 1)]) + [TICK, 5, KILL, 0, ADV, 250],
    "src_kill_late_copy": [UNFENCE] + puts([0, 1]) + p_lookup(1, 1, [0, 1]) + [N_SCRIPT, 4, 40]
    + p_fetch(1, 1, [(0, 1, 0), (1, 1, 1)]) + [TICK, 5, KILL, 1, ADV, 60, KILL, 2, ADV, 200],
    "src_dup_fetch": [FENCE] + puts([0]) + p_lookup(1, 1, [0]) + p_fetch(1, 1, [(0, 1, 0)])
    + [ADV, 5] + p_fetch(1, 1, [(0, 1, 0)]) + p_fetch(1, 1, [(0, 2, 1)]),
    "src_slot_out_of_range": [FENCE] + puts([0]) + p_lookup(1, 1, [0])
    + p_fetch(1, 1, [(0, 1, 250)]) + [ADV, 20],
    "src_retained_limit": [SMALL] + puts([0, 1, 2]) + p_lookup(1, 1, [0]) + p_lookup(2, 1, [1])
    + [N_SCRIPT, 0, 0] + p_fetch(1, 1, [(0, 1, 0)]) + [TICK, 3, KILL, 0, ADV, 30]
    + p_lookup(2, 1, [1]) + p_fetch(2, 1, [(1, 1, 1)]) + [ADV, 250],
    "src_pin_limit": [SMALL] + puts([0, 1, 2, 3]) + p_lookup(1, 1, [0, 1, 2, 3])
    + p_lookup(2, 1, [0, 1, 2, 3]) + [N_GET, 0, ADV, 40],
    # node as consumer
    "con_fetch_ok": [FENCE] + n_lookup(1, [0, 1]) + [TICK, 5] + resp(0, [1, 1])
    + n_fetch(1, [0, 1]) + [TICK, 5, P_WRITE, 0, 3, 2, 0] + done(0) + [ADV, 5],
    "con_fetch_bad_digest": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [TICK, 5, P_WRITE, 0, 1, 2, 0] + done(0, bad=1),
    "con_fetch_done_early_count": [FENCE] + n_lookup(1, [0, 1]) + [TICK, 5] + resp(0, [1, 1])
    + n_fetch(1, [0, 1]) + [TICK, 5] + done(0, n=0xc0),
    "con_delayed_write_kill": [FENCE] + n_lookup(1, [0, 1]) + [TICK, 5] + resp(0, [1, 1])
    + n_fetch(1, [0, 1]) + [TICK, 5, P_WRITE, 0, 3, 3, 20, KILL, 0, ADV, 250],
    "con_delayed_write_unfenceable": [UNFENCE] + n_lookup(1, [0, 1]) + [TICK, 5]
    + resp(0, [1, 1]) + n_fetch(1, [0, 1]) + [TICK, 5, P_WRITE, 0, 3, 3, 20, KILL, 1,
                                              ADV, 100, KILL, 2, ADV, 250],
    "con_wedged_hold_cap": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [TICK, 5, P_WRITE, 0, 1, 0, 0, ADV, 250, ADV, 50],
    "con_abort_ack": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1]) + n_fetch(1, [0])
    + [ADV, 110, P_ACK, 0, ADV, 10],
    "con_abort_ack_lost": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [ADV, 200],
    "con_cancel_then_done": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [TICK, 3, N_CANCEL, 1, TICK, 3] + done(0) + [P_ACK, 0],
    "con_finish_during_load": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [TICK, 3, N_FINISH, 1, TICK, 10] + done(0),
    "con_endpoint_error": [FENCE] + n_lookup(1, [0]) + [TICK, 5] + resp(0, [1])
    + n_fetch(1, [0]) + [TICK, 3, N_EPERR, 1, ADV, 10, P_ACK, 0, N_EPERR, 0],
    "con_wait_for_supply": [FENCE] + n_fetch(4, [7, 8], flags=1) + [TICK, 5, P_WRITE, 0, 3, 2, 0]
    + done(0),
    "con_limits": [SMALL] + n_lookup(1, [0, 1, 2, 3]) + [TICK, 5] + resp(0, [1, 1, 1, 1])
    + n_fetch(1, [0, 1, 2, 3]) + n_fetch(1, [0]) + [KILL, 0, ADV, 30]
    + n_fetch(1, [4, 5]) + [ADV, 30],
    "con_bad_lookup_resp": [FENCE] + n_lookup(1, [0, 1]) + [TICK, 5, P_RESP, 0, 0xc3, 1, 1, 1],
    # epochs, reconnects, identity
    "stale_after_reconnect": [FENCE] + n_lookup(1, [0]) + [TICK, 5, KILL, 0, ADV, 30]
    + [EPOCH, 1] + resp(0, [1]) + [EPOCH, 2] + done(1, n=1) + [EPOCH, 3] + [7] * 32
    + [P_ACK, 1, 1, 1, EPOCH, 4] + [9] * 32 + p_lookup(1, 1, [0]),
    "zero_epoch": [FENCE] + [EPOCH, 3] + [0] * 32 + p_lookup(1, 1, [0]),
    "bye_and_back": [FENCE, P_BYE, 0, ADV, 20, P_BYE, 2, ADV, 20, N_PEER, 1, ADV, 20,
                     N_PEER, 0, ADV, 20, PING, TICK, 10],
    "node_killed": [FENCE] + puts([0]) + p_lookup(1, 1, [0]) + p_fetch(1, 1, [(0, 1, 0)])
    + [KILL, 4, ADV, 50],
    "partition_heal": [FENCE] + n_lookup(1, [0]) + [KILL, 1, ADV, 40, KILL, 2, ADV, 40],
    "max_sessions_one": [4, N_PEER, 1, ADV, 30, KILL, 0, ADV, 30],
}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(out, exist_ok=True)
    for name, ops in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(bytes(b & 0xff for b in ops))
    print(f"wrote {len(SEEDS)} seeds to {out}")


if __name__ == "__main__":
    main()
