"""kvpeer.dns_peers: peers from a DNS name that resolves to many addresses
(a Kubernetes headless service), issue 28 item 2.

A thread of its own resolves ``name:port`` at once and then every
``interval_s`` (getaddrinfo blocks: never on the caller's thread); the tier
reads the latest answer with :meth:`DnsPeers.peers` (no blocking). The tier
asks those peers like its static ones: an address it has no session with is
dialled on demand (kvpeer.dialer), and an address that vanished from the
answer is no longer asked; its session closes once idle (the node's
``idle_session_ms``), and one that is not up is forgotten at the next answer
(:meth:`DnsPeers.drop_vanished`).

Bounded: at most ``max_peers`` addresses are kept (those already known first,
then the new ones in sorted order), so a name that resolves to 10 000
addresses does not make 10 000 sessions; the rest are counted
(``truncated``) and logged once per answer size.
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from typing import Callable, Iterable, List, Optional, Sequence, Set, Tuple

log = logging.getLogger("kvpeer.dns")

DEFAULT_INTERVAL_S = 30.0
DEFAULT_MAX_PEERS = 64

# (host, port) -> the addresses the name resolves to (strings: IPv4 or IPv6)
Resolver = Callable[[str, int], Sequence[str]]


def getaddrinfo_resolver(host: str, port: int) -> List[str]:
    """The system resolver (getaddrinfo, TCP), every address once."""
    out: List[str] = []
    for fam, _, _, _, sa in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if fam in (socket.AF_INET, socket.AF_INET6) and sa[0] not in out:
            out.append(sa[0].split("%")[0])
    return out


def parse_source(source: str) -> Tuple[str, int]:
    """``"name:port"`` -> (name, port); ValueError naming what is wrong."""
    if not isinstance(source, str) or ":" not in source:
        raise ValueError(f"kvpeer: peers_dns must be 'name:port', got {source!r}")
    host, _, port_s = source.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_s)
    except ValueError:
        port = -1
    if not host or not 1 <= port <= 65535 or len(host) > 253:
        raise ValueError(f"kvpeer: peers_dns must be 'name:port' (port 1..65535), got {source!r}")
    return host, port


def peer_name(addr: str, port: int) -> Optional[str]:
    """An address as kvpeer names a peer ("1.2.3.4:7000", "[::1]:7000");
    None for anything that is not an IP address (a hostile answer)."""
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


class DnsPeers:
    """Ownership: owns its thread (stopped by close()); borrows nothing."""

    def __init__(self, source: str, interval_s: float = DEFAULT_INTERVAL_S,
                 max_peers: int = DEFAULT_MAX_PEERS, exclude: Iterable[str] = (),
                 resolver: Optional[Resolver] = None) -> None:
        self.host, self.port = parse_source(source)
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) \
                or not 0.05 <= interval_s <= 86400:
            raise ValueError(f"kvpeer: peers_dns_interval_s must be 0.05..86400, got {interval_s!r}")
        if isinstance(max_peers, bool) or not isinstance(max_peers, int) or max_peers < 1:
            raise ValueError(f"kvpeer: peers_dns_max must be an int >= 1, got {max_peers!r}")
        self.interval_s = float(interval_s)
        self.max_peers = max_peers
        self.exclude: Set[str] = set(exclude)
        self._resolve = resolver or getaddrinfo_resolver
        self._mu = threading.Lock()
        self._peers: List[str] = []
        self._vanished: Set[str] = set()
        self.resolutions = 0     # answers taken
        self.failures = 0        # resolutions that failed (the last answer stands)
        self.truncated = 0       # addresses left out for max_peers, last answer
        self._last_trunc = -1
        self._stop = threading.Event()
        self._resolved = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvpeer-dns", daemon=True)
        self._thread.start()

    def peers(self) -> List[str]:
        """The latest answer (at most max_peers names)."""
        with self._mu:
            return list(self._peers)

    def take_vanished(self) -> Set[str]:
        """Names that left the answer since the last call."""
        with self._mu:
            out, self._vanished = self._vanished, set()
            return out

    def wait_resolved(self, timeout: float) -> bool:
        """Wait for the first answer (tests, tools)."""
        return self._resolved.wait(timeout)

    def resolve_now(self) -> None:
        """One resolution on the caller's thread (tests)."""
        self._once()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.interval_s)

    def _once(self) -> None:
        try:
            addrs = list(self._resolve(self.host, self.port))
        except Exception as e:  # NXDOMAIN, timeout: keep the last answer
            self.failures += 1
            if self.failures & (self.failures - 1) == 0:  # 1, 2, 4, ...: bounded log
                log.warning("peers_dns %r: cannot resolve (%s); keeping %d peers (%d failures)",
                            self.host, e, len(self._peers), self.failures)
            self._resolved.set()
            return
        names: List[str] = []
        seen: Set[str] = set()
        for a in addrs:
            n = peer_name(str(a), self.port)
            if n is not None and n not in seen and n not in self.exclude:
                seen.add(n)
                names.append(n)
        with self._mu:
            old = [p for p in self._peers if p in seen]  # known ones keep their place
            new = sorted(seen - set(old))
            keep = (old + new)[:self.max_peers]
            self._vanished |= set(self._peers) - set(keep)
            self._vanished -= set(keep)
            self._peers = keep
            self.truncated = len(seen) - len(keep)
        self.resolutions += 1
        if self.truncated and self.truncated != self._last_trunc:
            log.warning("peers_dns %r resolves to %d addresses: keeping %d (peers_dns_max)",
                        self.host, len(seen), len(keep))
        self._last_trunc = self.truncated
        self._resolved.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
