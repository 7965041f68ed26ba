#!/usr/bin/python3
"""make_seeds.py -- writes the wire fuzz seed corpus (fuzz/wire/corpus/).

One valid frame per message type, a stream of several frames, and a few
malformed frames. The layout mirrors src/wire/wire.h (little-endian,
u32 length | u16 type | u16 flags | payload). stdlib only.

    /usr/bin/python3 fuzz/wire/make_seeds.py [outdir]
"""
import os
import struct
import sys

HELLO, AUTH, HELLO_ACK, PING, PONG, BYE = 1, 2, 3, 4, 5, 6
LOOKUP, LOOKUP_RESP, FETCH, FETCH_DONE, ABORT, ABORT_ACK = 7, 8, 9, 10, 11, 12

SRC = bytes(range(1, 17))
DST = bytes(range(0x21, 0x31))


def frame(mtype, payload, flags=0):
    return struct.pack("<IHH", len(payload), mtype, flags) + payload


def epochs(payload):
    return SRC + DST + payload


def s8(b):
    return struct.pack("<B", len(b)) + b


def hello(major=1, peer=b"node-a:4100", inst=b"inst-1", epoch=bytes(range(0x41, 0x51))):
    return frame(HELLO, struct.pack("<HH", major, 0) + s8(peer) + s8(inst) + epoch +
                 struct.pack("<IIQQ", 4096, 1 << 20, 0x1122334455667788, 42) +
                 bytes(range(0x60, 0x70)) + struct.pack("<I", 1))


def lookup(keys, req=7, rnd=1):
    return frame(LOOKUP, epochs(struct.pack("<QQI", req, rnd, len(keys)) +
                                b"".join(s8(k) for k in keys)))


def lookup_resp(results, req=7, rnd=1):
    return frame(LOOKUP_RESP, epochs(struct.pack("<QQI", req, rnd, len(results)) + bytes(results)))


def fetch(items, flags=1, req=7, rnd=1):
    body = b"".join(s8(k) + struct.pack("<II", slot, gen) for k, slot, gen in items)
    return frame(FETCH, epochs(struct.pack("<QQII", req, rnd, flags, len(items)) + body))


def fetch_done(blocks, status=0, req=7, rnd=1):
    body = b"".join(struct.pack("<BQQ", ok, lo, hi) for ok, lo, hi in blocks)
    return frame(FETCH_DONE, epochs(struct.pack("<QQiI", req, rnd, status, len(blocks)) + body))


def seeds():
    keys = [b"k", bytes(32), b"x" * 64]
    valid = {
        "hello": hello(),
        "auth": frame(AUTH, epochs(bytes(range(32)))),
        "hello_ack": frame(HELLO_ACK, epochs(DST + struct.pack("<I", 24) + b"ucx-address-and-rkey-blb")),
        "ping": frame(PING, epochs(struct.pack("<QQ", 1, 123456789))),
        "pong": frame(PONG, epochs(struct.pack("<QQ", 1, 123456789))),
        "bye": frame(BYE, epochs(struct.pack("<H", 2))),
        "bye_compat": frame(BYE, epochs(struct.pack("<H", 5) + s8(b"llama-3-8b/bf16/16"))),
        "lookup": lookup(keys),
        "lookup_resp": lookup_resp([1, 0, 1]),
        "fetch": fetch([(k, i * 3, 9) for i, k in enumerate(keys)]),
        "fetch_empty": fetch([], flags=0),
        "fetch_done": fetch_done([(1, 0x1111, 0x2222), (0, 0, 0)], status=0),
        "abort": frame(ABORT, epochs(struct.pack("<QQ", 7, 1))),
        "abort_ack": frame(ABORT_ACK, epochs(struct.pack("<QQ", 7, 1))),
    }
    out = {"valid_" + k: v for k, v in valid.items()}
    out["stream_handshake"] = valid["hello"] + valid["auth"] + valid["hello_ack"] + valid["ping"]
    out["stream_request"] = valid["lookup"] + valid["lookup_resp"] + valid["fetch"] + \
        valid["fetch_done"] + valid["abort"] + valid["abort_ack"] + valid["bye"]
    bad = {
        "unknown_type": frame(99, epochs(b"")),
        "hello_bad_major": hello(major=2),
        "hello_empty_peer": hello(peer=b""),
        "hello_zero_epoch": hello(epoch=bytes(16)),
        "lookup_key_65": lookup([b"y" * 65]),
        "lookup_key_0": lookup([b""]),
        "lookup_count_lies": frame(LOOKUP, epochs(struct.pack("<QQI", 1, 1, 60000) + s8(b"k"))),
        "fetch_slot_range": fetch([(b"k", 5000, 1)]),
        "ping_zero_epoch": frame(PING, bytes(32) + struct.pack("<QQ", 1, 2)),
        "ping_trailing": frame(PING, epochs(struct.pack("<QQ", 1, 2))[:-1]),
        "hello_ack_big_blob": frame(HELLO_ACK, epochs(DST + struct.pack("<I", 70000))),
        "truncated_header": valid["ping"][:5],
        "bye_compat_unprintable": frame(BYE, epochs(struct.pack("<H", 5) + s8(b"a\x01b"))),
        "bye_compat_other_reason": frame(BYE, epochs(struct.pack("<H", 3) + s8(b"x"))),
        "bye_compat_41": frame(BYE, epochs(struct.pack("<H", 5) + s8(b"c" * 41))),
        "oversized": struct.pack("<IHH", 0x7FFFFFFF, LOOKUP, 0),
    }
    out.update({"bad_" + k: v for k, v in bad.items()})
    return out


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    os.makedirs(outdir, exist_ok=True)
    for name, data in sorted(seeds().items()):
        with open(os.path.join(outdir, name), "wb") as fp:
            fp.write(data)
    print("wrote %d seeds to %s" % (len(seeds()), outdir))


if __name__ == "__main__":
    main()
