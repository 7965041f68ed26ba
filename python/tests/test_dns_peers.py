"""Issue 28 item 2: peers from a DNS name resolving to many addresses (a
Kubernetes headless service) in the Python tier (kvpeer.dns_peers). A test
resolver stands in for the DNS server (nothing is written to /etc/hosts); the
nodes listen on loopback addresses 127.0.0.2.. with one port, as the pods of a
headless service do. The system resolver is exercised with ``localhost``."""
from __future__ import annotations

import socket
import threading
import time
from typing import List

import pytest

from conftest import FAST, scaled
from kvpeer.dns_peers import DnsPeers, parse_source, peer_name
from kvpeer.tier import HIT, MISS, RETRY, KVPeerTier


class FakeDns:
    """A resolver whose answer the test sets; counts its calls."""

    def __init__(self, addrs: List[str]) -> None:
        self.addrs = list(addrs)
        self.calls = 0
        self.mu = threading.Lock()

    def __call__(self, host: str, port: int) -> List[str]:
        with self.mu:
            self.calls += 1
            if host != "svc.test":
                raise socket.gaierror(socket.EAI_NONAME, "unknown name")
            return list(self.addrs)


def free_port_on(*hosts: str) -> int:
    """A port free on every one of ``hosts``."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts[1:]:
                with socket.socket() as t:
                    t.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


def settle(tier: KVPeerTier, keys, req: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        res = tier.lookup_many(keys, req)
        if RETRY not in res or time.monotonic() > deadline:
            return res
        time.sleep(0.02)


def test_parse_and_hostile_answers():
    assert parse_source("svc.ns.svc.cluster.local:7000") == ("svc.ns.svc.cluster.local", 7000)
    for bad in ("svc", "svc:0", "svc:70000", ":7000", "svc:x", 7000, "a" * 300 + ":1"):
        with pytest.raises(ValueError, match="peers_dns"):
            parse_source(bad)  # type: ignore[arg-type]
    assert peer_name("10.0.0.1", 7) == "10.0.0.1:7"
    assert peer_name("fe80::1", 7) == "[fe80::1]:7"
    for junk in ("10.0.0.1\n", "evil.example", "10.0.0.1:99", "", "1.2.3.4 x"):
        assert peer_name(junk, 7) is None
    fake = FakeDns(["10.0.0.2", "evil\nname", "10.0.0.2", "::1", "10.0.0.1"])
    d = DnsPeers("svc.test:7000", interval_s=3600, resolver=fake)
    try:
        assert d.wait_resolved(scaled(5))
        assert d.peers() == ["10.0.0.1:7000", "10.0.0.2:7000", "[::1]:7000"]
        fake.addrs = []  # an empty answer: every peer vanished
        d.resolve_now()
        assert d.peers() == [] and d.take_vanished() == {"10.0.0.1:7000", "10.0.0.2:7000",
                                                          "[::1]:7000"}
        fake.addrs = ["10.0.0.3"]
        d.host = "nxdomain.test"  # a failed resolution keeps the last answer
        d.resolve_now()
        assert d.failures == 1 and d.peers() == []
    finally:
        d.close()


def test_ten_thousand_addresses_bounded():
    """A name resolving to 10 000 addresses keeps max_peers of them (known
    ones first), and a tier asks and dials only those: the node never wants
    more peers than that."""
    many = [f"127.{1 + i // 250 % 250}.{i % 250}.{1 + i // 62500}" for i in range(10000)]
    assert len(set(many)) == 10000
    fake = FakeDns(many)
    d = DnsPeers("svc.test:9", interval_s=3600, max_peers=8, resolver=fake)
    assert d.wait_resolved(scaled(5))
    first = d.peers()
    assert len(first) == 8 and d.truncated == 9992
    fake.addrs = [many[-1]] + many  # a reordered, larger answer: the same 8 stay
    d.resolve_now()
    assert d.peers() == first
    t = KVPeerTier(dns=d, dial_wait_s=0.2, **FAST)
    try:
        res = settle(t, [b"k" * 32], 1, scaled(10))
        assert res == [MISS]  # nobody listens on those addresses
        wanted = [s for s in t.node.peer_states() if s.wanted]
        assert 1 <= len(wanted) <= 8, [s.peer for s in wanted]
        assert {s.peer for s in wanted} <= set(first)
        assert len(t.node.peers()) <= 8
    finally:
        t.shutdown(timeout=1)
    assert not d._thread.is_alive()


def test_tier_follows_the_answer(node_factory):
    """Nodes X (127.0.0.2), Y (127.0.0.3), Z (127.0.0.4) on one port; the name
    resolves to X, Y: a key Y holds is found (Y dialled on demand). The answer
    becomes X, Z: a key Z holds is found, Y is no longer asked (its key:
    MISS) and its session closes once idle, not redialled."""
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = free_port_on(*hosts)
    x, y, z = (node_factory(listen_addr=f"{h}:{port}") for h in hosts)
    ky, kz = b"y" * 32, b"z" * 32
    y.put(ky, b"Y" * 65536)
    z.put(kz, b"Z" * 65536)
    fake = FakeDns(["127.0.0.3", "127.0.0.2"])
    d = DnsPeers("svc.test:%d" % port, interval_s=3600, resolver=fake)
    assert d.wait_resolved(scaled(5))
    t = KVPeerTier(dns=d, dial_wait_s=scaled(2), **{**FAST, "idle_session_ms": 600})
    try:
        assert t.node.peer_states() == []  # nothing dialled before a lookup wants it
        assert settle(t, [ky], 1, scaled(10)) == [HIT]
        assert settle(t, [kz], 2, scaled(10)) == [MISS]
        fake.addrs = ["127.0.0.2", "127.0.0.4"]
        d.resolve_now()
        assert settle(t, [kz], 3, scaled(10)) == [HIT]
        assert settle(t, [ky], 4, scaled(10)) == [MISS]  # Y is not asked any more
        t.on_request_finished(1)
        yp = f"127.0.0.3:{port}"
        deadline = time.monotonic() + scaled(10)
        while time.monotonic() < deadline and any(
                s.peer == yp and s.wanted for s in t.node.peer_states()):
            t.lookup_many([b"q" * 32], 5)  # the tier keeps working meanwhile
            time.sleep(0.1)
        assert not any(s.peer == yp and s.wanted for s in t.node.peer_states())
        assert yp not in {p.peer for p in t.node.peers() if p.ready}
    finally:
        t.shutdown(timeout=1)


def test_localhost_through_the_system_resolver(node_factory):
    """getaddrinfo on its own thread: ``localhost`` gives 127.0.0.1 (and ::1
    where the host has it); a tier finds a key of the node on 127.0.0.1."""
    a = node_factory(listen_addr="127.0.0.1:0")
    port = int(a.peer_id.rpartition(":")[2])
    a.put(b"l" * 32, b"L" * 65536)
    d = DnsPeers(f"localhost:{port}", interval_s=3600)
    assert d.wait_resolved(scaled(10))
    assert f"127.0.0.1:{port}" in d.peers(), d.peers()
    t = KVPeerTier(dns=d, dial_wait_s=scaled(2), **FAST)
    try:
        assert settle(t, [b"l" * 32], 1, scaled(10)) == [HIT]
    finally:
        t.shutdown(timeout=1)


def test_a_slow_resolver_never_blocks_lookups():
    """getaddrinfo that hangs (a dead DNS server) runs on the resolver's
    thread: the tier's lookups answer at once meanwhile (MISS: no peer yet)."""
    release = threading.Event()

    def slow(host: str, port: int) -> List[str]:
        release.wait(scaled(20))
        return ["127.0.0.9"]

    d = DnsPeers("svc.test:9", interval_s=3600, resolver=slow)
    t = KVPeerTier(dns=d, dial_wait_s=0.2, **FAST)
    try:
        t0 = time.monotonic()
        assert t.lookup_many([b"s" * 32], 1) == [MISS]
        assert time.monotonic() - t0 < 1.0
        assert not d.wait_resolved(0)
    finally:
        release.set()
        t.shutdown(timeout=1)
