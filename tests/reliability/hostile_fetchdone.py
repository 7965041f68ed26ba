#!/usr/bin/env python3
"""hostile_fetchdone.py -- a FETCH_DONE with no write (issue 27, data plane).

    hostile_fetchdone.py KVPEERD_BINARY

D is a kvpeerd without a PSK on loopback, G a good peer of D, X a real
kvpeerd on this host. A raw stdlib SOURCE connects to D, completes the
handshake with X's real blob (so its host id claims this host, and the
direct-shm path, but it never wrote D's probe segment: it proved nothing),
answers D's LOOKUP with hits and D's FETCH with a FETCH_DONE "ok" -- and
never writes a byte. D then waits for the blocks to land (which never
happens) instead of committing on the source's word (ucx_am.c
kvp__ucx_landing_required, session/client.c load_awaits_landing).

  zero    the FETCH_DONE's digests are those of all-zero blocks; D's
          destination slots were never written (free slots of a fresh
          region): committed, they would verify.
  stale   D's region full; the fetch evicts READY slots and the digests
          are those of what those slots still hold. The source learns that
          by reading D's region through /proc/PID/fd (an oracle stronger
          than any attacker; checked against the known blocks D put).

  relay   a relay of the proof, with no access to memory: the client
          captures D's blob, hands it to X as its own (X, adding that peer,
          writes its proof mark into D's probe segment), then gives D X's
          blob and answers D's FETCH with the digests of D's slots. Before
          the proof was bound to the control connection (kvp_link_binding,
          transport bind_next_peer) D found X's secret, called the source
          "proven" and committed 8 of 8. Now X's mark is for X's connection
          to the client, not for the client's connection to D.

Each case asserts: D's fetch fails every block (n_ok 0, not "ok"); the
source's keys are absent from D (/admin/verify: missing = count, bad = 0);
D alive, its own blocks verify (bad = 0); G's fetch from D succeeds before
and after, and G's blocks verify. D, G, X exit cleanly.
"""
import argparse
import os
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import relib  # noqa: E402
from relib import check, log, scaled, wait_for  # noqa: E402
import hostile as H  # noqa: E402

NB, BS = 64, 65536  # D's and X's layout (H.BLOCK_SIZE, a small region)
HOSTILE_FIRST = 9000  # the keys the hostile source "has"
N_KEYS = 8


def demo_block(k, n=BS):
    """tools/demo_blocks.h kvpeer_demo_block(k): the admin API's block k."""
    m = (1 << 64) - 1

    def splitmix(x):
        x = (x + 0x9e3779b97f4a7c15) & m
        z = x
        z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
        z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
        return x, z ^ (z >> 31)

    def rotl(x, r):
        return ((x << r) | (x >> (64 - r))) & m

    seed, s = 0x5eed0000 + k, []
    for _ in range(4):
        seed, v = splitmix(seed)
        s.append(v)
    out = []
    for _ in range(n // 8):
        v = (rotl((s[1] * 5) & m, 7) * 9) & m
        t = (s[1] << 17) & m
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        out.append(v)
    return struct.pack("<%dQ" % len(out), *out)


def region_file(pid):
    """The path under /proc/PID/fd of D's region: UCX's posix segment of
    exactly NB * BS bytes (unlinked from /dev/shm, open through the fd)."""
    d = "/proc/%d/fd" % pid
    found = []
    for fd in os.listdir(d):
        p = os.path.join(d, fd)
        try:
            if "ucx_shm_posix" in os.readlink(p) and os.stat(p).st_size == NB * BS:
                found.append(p)
        except OSError:
            pass
    check(len(found) == 1, "D's region segment: want one %d-byte ucx_shm_posix fd, found %s" %
          (NB * BS, found))
    return found[0]


def slot_bytes(path, slot):
    with open(path, "rb") as f:
        f.seek(slot * BS)
        return f.read(BS)


class Source(H.Raw):
    """The hostile source: X's blob in its HELLO_ACK; answers every LOOKUP
    with hits and every FETCH with a FETCH_DONE "ok" whose digests come from
    digest_of(dst_slot). It never writes anything anywhere."""

    def __init__(self, addr, fp, xblob, digest_of):
        super().__init__(addr, fp, NB)
        self.digest_of = digest_of
        self.fetches = []  # [(key, dst_slot, dst_gen)] per FETCH
        self.lookups = 0
        self.stop = threading.Event()
        check(self.handshake(scaled(10)), "source: handshake with D failed (%s)" % self.hs_types)
        self.ack(xblob)
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def serve(self):
        while not self.stop.is_set():
            f = self.recv_frame(0.2)
            if f is None:
                continue
            t, p = f
            if t == H.T_LOOKUP:
                req, rnd, n = struct.unpack("<QQI", p[:20])
                self.lookups += 1
                self.send(H.T_LOOKUP_RESP, struct.pack("<QQI", req, rnd, n) + b"\x01" * n)
            elif t == H.T_FETCH:
                req, rnd, _flags, n = struct.unpack("<QQII", p[:24])
                off, items, blocks = 24, [], b""
                for _ in range(n):
                    kl = p[off]
                    key = p[off + 1:off + 1 + kl]
                    slot, gen = struct.unpack("<II", p[off + 1 + kl:off + 9 + kl])
                    off += 9 + kl
                    items.append((key.decode(), slot, gen))
                    blocks += struct.pack("<BQQ", 1, *self.digest_of(slot))
                self.fetches.append(items)
                self.send(H.T_FETCH_DONE, struct.pack("<QQiI", req, rnd, 0, n) + blocks)

    def close(self):
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(5)
        super().close()


def good_fetch(G, D, req):
    """G fetches 8 of D's blocks; must succeed and verify."""
    first = {1: 8, 2: 16, 3: 24, 4: 40}[req]  # keys G does not hold yet, not evicted from D
    r = G.fetch(D.peer, first, 8, req, timeout_ms=20000)
    G.ok("/admin/finish?request=%d" % req, "POST")
    check(r.get("status_code") == "0" and r.get("n_ok") == "8",
          "G's fetch %d from D failed: %s" % (req, r))
    v = G.verify(first, 8)
    check(v["bad"] == 0 and v["present"] == 8, "G's fetched blocks: %s" % v)


def attack(D, G, fp, xblob, name, digest_of, req):
    """One hostile source session and one fetch of D from it."""
    src = Source(D.peer, fp, xblob, digest_of)
    src.thread.start()
    wait_for(lambda: D.peer_ready(src.peer_id), "D's session with the source", 10)
    # the claim took: D put the source on the direct-shm path (X's host id)
    check(H.log_has(D, "peer %s (instance" % src.peer_id, "data path direct-shm"),
          "%s: D did not classify the source direct-shm (the claim is not tested)" % name)
    c0 = D.metrics().get("kvpeer_blocks_in_total", 0)
    t0 = time.monotonic()
    r = D.fetch(src.peer_id, HOSTILE_FIRST, N_KEYS, req, timeout_ms=20000)
    secs = time.monotonic() - t0
    D.ok("/admin/finish?request=%d" % req, "POST")
    items = src.fetches[0] if src.fetches else []
    src.close()
    v = D.verify(HOSTILE_FIRST, N_KEYS)
    log("%s: D's fetch from the source: %s (%.2f s); source saw %d LOOKUP, FETCH of slots %s;"
        " D verify of the source's keys %s" % (name, r, secs, src.lookups,
                                               [s for _, s, _ in items], v))
    check(len(items) == N_KEYS, "%s: D sent no FETCH of %d keys to the source (%s)" %
          (name, N_KEYS, items))
    check(r.get("n_ok") == "0" and r.get("status_code") != "0",
          "%s: D accepted blocks nobody wrote: %s" % (name, r))
    check(v["present"] == 0 and v["bad"] == 0 and v["missing"] == N_KEYS,
          "%s: D holds the source's keys: %s" % (name, v))
    check(H.log_has(D, "peer %s:" % src.peer_id, "never reached us after FETCH_DONE"),
          "%s: D's log does not say the blocks never landed" % name)
    check(D.proc.poll() is None, "%s: D died" % name)
    c1 = D.metrics().get("kvpeer_blocks_in_total", c0)
    check(c1 == c0, "%s: D counted %d blocks in" % (name, c1 - c0))
    return items


def relay(D, X, fp, xblob, region):
    """The relay: X writes its proof into D's segment for a session whose
    blob is D's (borrowed); D then takes X's blob from the source."""
    dblob = H.capture_blob(D.peer, fp, NB)
    r = H.Raw(X.peer, fp, NB)
    check(r.handshake(scaled(10)), "relay: handshake with X failed (%s)" % r.hs_types)
    r.ack(dblob)
    wait_for(lambda: X.peer_ready(r.peer_id), "X's session with the relay (D's blob)", 10)
    src = Source(D.peer, fp, xblob, lambda slot: H.digest(slot_bytes(region, slot)))
    src.thread.start()
    wait_for(lambda: D.peer_ready(src.peer_id), "D's session with the relayed source", 10)
    res = D.fetch(src.peer_id, HOSTILE_FIRST + 100, N_KEYS, 300, timeout_ms=20000)
    D.ok("/admin/finish?request=300", "POST")
    src.close()
    r.close()
    v = D.verify(HOSTILE_FIRST + 100, N_KEYS)
    proven = H.log_has(D, "same host proven")
    log("relay: D %s the source proven; fetch %s; D verify of the source's keys %s" %
        ("called" if proven else "did not call", res, v))
    check(D.proc.poll() is None, "relay: D died")
    check(not proven, "relay: D took X's proof, written for another connection")
    check(res.get("n_ok") == "0" and res.get("status_code") != "0",
          "relay: D accepted blocks nobody wrote: %s" % res)
    check(v["present"] == 0 and v["bad"] == 0 and v["missing"] == N_KEYS,
          "relay: D holds the source's keys: %s" % v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpeerd")
    a = ap.parse_args()
    kvpeerd = os.path.abspath(a.kvpeerd)
    fp = H.fingerprint()
    common = relib.hostile_args(H.COMPAT, NB)
    D, G = relib.serving_pair(kvpeerd, common)
    X = relib.Daemon(kvpeerd, "X", common).start()
    xblob = H.capture_blob(X.peer, fp, NB)
    D.put(0, NB // 2)  # slots 0..31 hold blocks 0..31; 32..63 never written
    region = region_file(D.proc.pid)
    good_fetch(G, D, 1)

    # zero: free, never-written destination slots, zero digests
    zero = H.digest(bytes(BS))
    items = attack(D, G, fp, xblob, "zero", lambda slot: zero, 100)
    check(all(H.digest(slot_bytes(region, s)) == zero for _, s, _ in items),
          "zero: D's destination slots were not all-zero (the case proves nothing)")
    good_fetch(G, D, 2)
    check(D.verify(0, NB // 2)["bad"] == 0, "zero: D's own blocks changed")

    # stale: every slot READY; the fetch evicts some, whose content the
    # source reads and whose digests it sends
    D.put(NB // 2, NB // 2)
    known = {H.digest(demo_block(k)): k for k in range(NB)}
    held = [known.get(H.digest(slot_bytes(region, s))) for s in range(NB)]
    check(None not in held, "stale: the region oracle does not see D's blocks: %s" % held)
    items = attack(D, G, fp, xblob, "stale", lambda slot: H.digest(slot_bytes(region, slot)), 200)
    check(all(H.digest(slot_bytes(region, s)) != zero for _, s, _ in items),
          "stale: a destination slot held zeros (the case proves nothing new)")
    log("stale: the source named D's slots %s, which held blocks %s" %
        ([s for _, s, _ in items], [held[s] for _, s, _ in items]))
    good_fetch(G, D, 3)
    v = D.verify(0, NB)
    check(v["bad"] == 0, "stale: D's own blocks: %s" % v)
    relay(D, X, fp, xblob, region)
    good_fetch(G, D, 4)
    check(D.verify(0, NB)["bad"] == 0, "relay: D's own blocks changed")
    for d in (G, X, D):
        d.check_clean_exit(d.stop())
    log("hostile_fetchdone: OK")


if __name__ == "__main__":
    main()
