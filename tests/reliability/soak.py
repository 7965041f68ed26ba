#!/usr/bin/env python3
"""soak.py -- three kvpeerd processes under churn for a while (issue 9).

    soak.py KVPEERD_BINARY [--seconds N]      (default 30: the CI form, < 60 s)
    make soak MINUTES=10                       (the long form)

Node S is steady (never killed); X and Y are killed (SIGKILL) or restarted
(SIGTERM, drain) in turn every few seconds, on the same address. A loop of
puts and fetches runs meanwhile: X and Y fetch fresh blocks from S (must
succeed whenever the consumer's session to S is ready), S and X/Y fetch from
each other (may fail while the source is down: counted, never corrupt).
At the end: every committed block on every node verifies (bad=0), no node
holds retained transfers or quarantined slots for longer than the hold cap,
S's RSS is reported at start and end (and must stay bounded), and every
daemon exits cleanly (no sanitizer report).
"""
import argparse
import os
import random
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402

HOLD_MS = 4000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def merge(ranges):
    """Coalesce (first, count) ranges (keys are handed out sequentially)."""
    out = []
    for k, n in sorted(ranges):
        if out and k <= out[-1][0] + out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], k + n - out[-1][0]))
        else:
            out.append((k, n))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    log("soak: %.0f s, seed %d" % (a.seconds, a.seed))
    addr = {n: "127.0.0.1:%d" % free_port() for n in ("S", "X", "Y")}
    common = ["--http", "127.0.0.1:0", "--admin", "--num_blocks", "512", "--block_size", "64K",
              "--compat", "soak", "--heartbeat_ms", "200", "--dead_after_ms", "1000",
              "--hold_cap_ms", str(HOLD_MS), "--backoff_min_ms", "50", "--backoff_max_ms", "500",
              "--load_timeout_ms", "10000", "--abort_ack_timeout_ms", "3000",
              "--shutdown_drain_ms", "500"]
    d = {}
    for n in ("S", "X", "Y"):
        others = ",".join(addr[m] for m in ("S", "X", "Y") if m != n)
        d[n] = relib.Daemon(os.path.abspath(a.kvpeerd), n,
                            common + ["--listen", addr[n], "--peers", others]).start()
    S = d["S"]
    wait_for(lambda: all(d[n].peer_ready(addr[m]) for n in d for m in d if m != n),
             "the full mesh", 30)
    S.put(9000000, 512)  # touch S's whole region first: RSS growth then means leaks
    cnt = dict(puts=0, fetch_ok=0, fetch_fail_allowed=0, fetch_skipped=0, kills=0,
               restarts=0, blocks=0)
    # S is never restarted: its counters must equal what this loop saw.
    s_in = dict(ok=0, failed=0, blocks=0)   # fetches into S (S the consumer)
    s_out = dict(ok=0, blocks=0)            # fetches from S (S the source)
    m0 = S.metrics()
    next_key = {n: {"S": 0, "X": 1000000, "Y": 2000000}[n] for n in d}
    ranges = {n: [] for n in d}  # (first, count) put on / fetched into each node
    req = 0
    t_start = time.monotonic()
    end = t_start + a.seconds
    # Memory is sampled every few seconds; "flat" is judged from the end of
    # the warm-up (both churned nodes restarted once and a quarter of the run
    # gone: allocator arenas, UCX endpoint pools and the peers' mapped
    # regions are then at their working size) to the end.
    series = [(0.0, S.mem())]
    warm = None
    next_sample = t_start + 5
    next_churn = time.monotonic() + 4
    victim = "X"
    while time.monotonic() < end:
        now = time.monotonic()
        if now >= next_sample:
            series.append((now - t_start, S.mem()))
            next_sample = now + 5
            if warm is None and cnt["kills"] + cnt["restarts"] >= 2 and \
                    now - t_start >= a.seconds / 4:
                warm = series[-1]
        if time.monotonic() >= next_churn:
            v = d[victim]
            if rnd.random() < 0.5:
                v.proc.send_signal(signal.SIGKILL)
                v.proc.wait()
                cnt["kills"] += 1
                log("SIGKILL %s" % victim)
                time.sleep(0.5)
            else:
                v.check_clean_exit(v.stop())
                cnt["restarts"] += 1
                log("restart %s (SIGTERM)" % victim)
            v.start()
            next_key[victim] += 100000  # a restarted node has an empty store
            victim = "Y" if victim == "X" else "X"
            next_churn = time.monotonic() + rnd.uniform(3, 6)
        req += 1
        src = rnd.choice(["S", "S", "X", "Y"])
        dst = rnd.choice([n for n in d if n != src])
        k = next_key[src]
        n = rnd.randint(1, 16)
        d[src].put(k, n)
        ranges[src].append((k, n))
        next_key[src] += n
        cnt["puts"] += 1
        if not d[dst].peer_ready(addr[src]):
            cnt["fetch_skipped"] += 1
            continue
        r = d[dst].fetch(addr[src], k, n, req, timeout_ms=int(scaled(15000)))
        ranges[dst].append((k, n))
        d[dst].ok("/admin/finish?request=%d" % req, "POST")
        ok = r.get("status_code") == "0" and r.get("n_ok") == str(n)
        if ok:
            cnt["fetch_ok"] += 1
            cnt["blocks"] += n
        elif src == "S":
            check(False, "fetch %s <- S of %d blocks failed: %s" % (dst, n, r))
        else:
            cnt["fetch_fail_allowed"] += 1
        if src == "S":
            s_out["ok"] += 1
            s_out["blocks"] += n
        if dst == "S" and int(r.get("lookup_hits", "0")) > 0:  # a load was started
            s_in["ok" if ok else "failed"] += 1
            s_in["blocks"] += int(r.get("n_ok", "0"))
    log("counts %s" % cnt)
    log("S as consumer %s, as source %s" % (s_in, s_out))
    # everything held is released within the hold cap; every block verifies
    wait_for(lambda: all(sum(map(len, x.held()[:2])) == 0 for x in d.values()),
             "retained/quarantined released", HOLD_MS / 1000.0 + 10)
    present = 0
    for n, x in d.items():
        for k, cnt_k in merge(ranges[n]):
            v = x.verify(k, cnt_k)
            present += v["present"]
            check(v["bad"] == 0, "%s holds corrupt blocks in [%d, +%d): %s" % (n, k, cnt_k, v))
    log("verified %d present blocks, bad=0" % present)
    series.append((time.monotonic() - t_start, S.mem()))
    step = max(1, len(series) // 12)  # about a dozen samples, the last one always
    shown = series[::step] + ([series[-1]] if (len(series) - 1) % step else [])
    log("S memory kB over time: " + "; ".join(
        "%.0fs %d/%d/%d" % (t, m["VmRSS"], m["RssAnon"], m["RssShmem"]) for t, m in shown) +
        "  (VmRSS/RssAnon/RssShmem)")
    m = S.metrics()
    log("S force_releases=%d protocol_errors=%d peers_down=%d" % (
        m.get("kvpeer_force_releases_total", 0), m.get("kvpeer_protocol_errors_total", 0),
        m.get("kvpeer_peers_down_total", 0)))
    check(cnt["fetch_ok"] > 0, "no fetch succeeded")

    # Every counter adds up: S's own metrics against what the loop saw.
    def delta(name):
        return int(m.get(name, 0) - m0.get(name, 0))
    sums = {
        'fetches ok into S': (delta('kvpeer_fetches_total{result="ok"}'), s_in["ok"]),
        'fetches failed into S': (delta('kvpeer_fetches_total{result="failed"}') +
                                  delta('kvpeer_fetches_total{result="aborted"}'), s_in["failed"]),
        'blocks into S': (delta("kvpeer_blocks_in_total"), s_in["blocks"]),
        'blocks out of S': (delta("kvpeer_blocks_out_total"), s_out["blocks"]),
        'bytes out of S': (delta("kvpeer_bytes_out_total"), s_out["blocks"] * 65536),
    }
    for what, (metric, seen) in sums.items():
        log("adds up: %-22s metric %d, seen %d" % (what, metric, seen))
        check(metric == seen, "%s: S's metric says %d, the loop saw %d" % (what, metric, seen))
    for x in d.values():  # at rest: nothing pinned, in flight or held; slots all accounted
        mx = x.metrics()
        slots = sum(v for k, v in mx.items() if k.startswith("kvpeer_slots{"))
        check(slots == 512, "%s: slot states add up to %d of 512" % (x.name, slots))
        for g in ("kvpeer_pins", "kvpeer_loads_inflight", "kvpeer_retained_transfers",
                  "kvpeer_quarantined_slots"):
            check(mx.get(g, 0) == 0, "%s: %s = %d at rest" % (x.name, g, mx.get(g, 0)))

    if not relib.MEM_CHECKS:  # under valgrind RSS is the tool's own
        log("memory bounds not checked here (valgrind or TSan: RSS is the tool's)")
    else:
        # Resident memory flat (within 5 %) from the end of the warm-up to the end.
        warm = warm or series[min(1, len(series) - 1)]
        w, e = warm[1], series[-1][1]
        drift = (e["VmRSS"] - w["VmRSS"]) / float(w["VmRSS"])
        log("S RSS after warm-up (%.0f s) %d kB, at the end %d kB: %+.1f %% (private %+d kB)" % (
            warm[0], w["VmRSS"], e["VmRSS"], 100 * drift, e["RssAnon"] - w["RssAnon"]))
        check(abs(drift) <= 0.05 * relib.MEM_SLACK, "S's RSS drifted %+.1f %% after warm-up" %
              (100 * drift))
        grow = e["RssAnon"] - series[0][1]["RssAnon"]
        check(grow < 16 * 1024 * relib.MEM_SLACK, "S's private RSS grew by %d kB" % grow)
        # Shared memory grows with the peers' regions S writes into (direct
        # shared-memory puts), bounded by them: an old incarnation's region must
        # not stay mapped.
        region_kb = 512 * 64  # ours + two peers' regions, whatever their incarnation
        check(e["RssShmem"] <= 3 * region_kb + 8 * 1024,
              "S maps %d kB of shared memory (old peers' regions kept?)" % e["RssShmem"])
    for x in d.values():
        x.check_clean_exit(x.stop())
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
