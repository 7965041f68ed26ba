#!/usr/bin/env python3
"""test_kvpeerd_dns.py -- kvpeerd's peers_dns (issue 28): peers from a DNS
name resolving to many addresses (a Kubernetes headless service).

    test_kvpeerd_dns.py KVPEERD_BINARY CASE [SOURCE_DIR]

The DNS server is a getaddrinfo shim preloaded into the daemon: a name ending
in ".dns.test" resolves to the addresses listed in the file $KVPD_TEST_DNS_FILE
(read at every call, so the test changes the answer by rewriting it); every
other name goes to the system resolver. Nothing touches /etc/hosts. The
daemons listen on 127.0.0.2.. with one port, as a headless service's pods.
Helpers (Daemon, wait_for, peers_table, ...) are test_kvpeerd.py's.

Cases:
  members   the answer's addresses become ready peers; a block is fetched
            from one (verify bad=0); the answer changes: the new address is
            dialled, the vanished one is closed once idle and not redialled
  bound     an answer of 10 000 addresses: at most peers_dns_max are wanted;
            with a larger peers_dns_max the node's max_wanted_peers caps it;
            the daemon stays healthy and a good peer is served
  localhost the system resolver (no shim): localhost:P gives 127.0.0.1:P
"""
import os
import socket
import sys
import time

import test_kvpeerd as T  # argv: KVPEERD CASE [SRC], as ctest passes them
from test_kvpeerd import SMALL, Daemon, check, fail, peer_field, peers_table, run, wait_for

DNS_SHIM = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* *.dns.test resolves to the addresses in $KVPD_TEST_DNS_FILE (one a line);
 * the nodes are allocated as glibc does (addr inside), so freeaddrinfo frees them. */
int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    static int (*real)(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    if (!real)
        real = (int (*)(const char *, const char *, const struct addrinfo *,
                        struct addrinfo **))dlsym(RTLD_NEXT, "getaddrinfo");
    size_t nl = node ? strlen(node) : 0;
    if (nl < 9 || strcmp(node + nl - 9, ".dns.test") != 0 ||
        (hints && (hints->ai_flags & AI_NUMERICHOST)))
        return real(node, service, hints, res);
    FILE *f = fopen(getenv("KVPD_TEST_DNS_FILE"), "r");
    if (f == NULL)
        return EAI_NONAME;
    char line[128];
    struct addrinfo *head = NULL, **tail = &head;
    int port = service ? atoi(service) : 0;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = 0;
        struct addrinfo *ai = calloc(1, sizeof(*ai) + sizeof(struct sockaddr_storage));
        if (ai == NULL)
            break;
        struct sockaddr_storage *ss = (struct sockaddr_storage *)(ai + 1);
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        if (inet_pton(AF_INET, line, &s4->sin_addr) == 1) {
            s4->sin_family = AF_INET;
            s4->sin_port = htons(port);
            ai->ai_family = AF_INET;
            ai->ai_addrlen = sizeof(*s4);
        } else if (inet_pton(AF_INET6, line, &s6->sin6_addr) == 1) {
            s6->sin6_family = AF_INET6;
            s6->sin6_port = htons(port);
            ai->ai_family = AF_INET6;
            ai->ai_addrlen = sizeof(*s6);
        } else {
            free(ai);
            continue;
        }
        ai->ai_socktype = SOCK_STREAM;
        ai->ai_protocol = IPPROTO_TCP;
        ai->ai_addr = (struct sockaddr *)ss;
        *tail = ai;
        tail = &ai->ai_next;
    }
    fclose(f);
    if (head == NULL)
        return EAI_NONAME;
    *res = head;
    return 0;
}
"""

DNS_FILE = os.path.join(T.TMP, "answer.txt")


def shim_env():
    src, lib = os.path.join(T.TMP, "dns.c"), os.path.join(T.TMP, "dns.so")
    open(src, "w").write(DNS_SHIM)
    r = run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-o", lib, src, "-ldl"])
    check(r.returncode == 0, "shim does not compile:\n" + r.stderr)
    env = dict(os.environ, LD_PRELOAD=lib, KVPD_TEST_DNS_FILE=DNS_FILE)
    env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0"
    return env


def answer(addrs):
    tmp = DNS_FILE + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(a + "\n" for a in addrs))
    os.rename(tmp, DNS_FILE)  # the shim never reads half a file


def common_port(hosts):
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
    fail("no port free on every one of %s" % hosts)


def node(name, host, port, extra=()):
    return Daemon(name, SMALL[2:] + ["--listen", "%s:%d" % (host, port), "--admin",
                                     "--heartbeat_ms", "200", "--dead_after_ms", "1000"]
                  + list(extra)).start()


def ready(d, peer):
    f = peers_table(d).get(peer)
    return f is not None and f.get("ready") == "1"


def case_members():
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = common_port(hosts)
    x, y, z = (node(n, h, port) for n, h in zip("xyz", hosts))
    answer(["127.0.0.3", "127.0.0.2", "not-an-address", "127.0.0.2"])
    a = Daemon("a", SMALL + ["--admin", "--heartbeat_ms", "200", "--dead_after_ms", "1000",
                             "--peers_dns", "svc.dns.test:%d" % port,
                             "--peers_dns_interval_ms", "300", "--idle_session_ms", "1500"],
               env=shim_env()).start()
    wait_for(lambda: ready(a, x.peer) and ready(a, y.peer), "x and y ready on a", dump=a.logpath)
    check(z.peer not in peers_table(a), "z wanted before the answer named it")
    check(set(peers_table(a)) == {x.peer, y.peer}, "peers: %r" % list(peers_table(a)))
    code, body = y.req("/admin/put?first=500&count=8&request=3", "POST")
    check(code == 200 and body == "put 8 0\n", "put on y: %d %r" % (code, body))
    code, body = a.req("/admin/fetch?peer=%s&first=500&count=8&request=5" % y.peer, "POST")
    f = dict(kv.split("=", 1) for kv in body.split())
    check(code == 200 and f.get("status") == "ok" and f.get("n_ok") == "8", "fetch: %r" % body)
    check(a.req("/admin/finish?request=5", "POST")[0] == 200, "finish")
    check(a.req("/admin/verify?first=500&count=8")[1] == "present=8 missing=0 bad=0\n", "verify")
    answer(["127.0.0.2", "127.0.0.4"])  # y leaves the service, z joins
    wait_for(lambda: ready(a, z.peer), "z dialled after the new answer", dump=a.logpath)
    # y: not wanted by the resolver any more; the node closes it once idle
    wait_for(lambda: peer_field(a, y.peer, "wanted") in (None, "0"),  # one snapshot
             "y closed once idle", timeout=15, dump=a.logpath)
    time.sleep(1.0 * T.SCALE)  # several more answers: y is not wanted again
    yt = peers_table(a).get(y.peer)
    check(yt is None or (yt["wanted"] == "0" and yt.get("ready") != "1"), "y back: %r" % yt)
    check(ready(a, x.peer) and ready(a, z.peer), "x, z ready: %r" % peers_table(a))
    log = a.logtext()
    check("event=peers_dns_vanished peer=%s" % y.peer in log, "vanished not logged:\n" + log)
    check(a.req("/healthz")[1] == "ok\n", "a not healthy")
    for d in (a, x, y, z):
        d.check_clean_exit(d.stop())


def case_bound():
    """10 000 addresses (127.1-40.x.y: nobody listens) and one good peer g
    (127.0.0.2): peers_dns_max 16 wants at most 16; a second daemon with
    peers_dns_max 65536 but max_wanted_peers 8 wants at most 8; both stay
    healthy, serve g's block and exit clean."""
    port = common_port(["127.0.0.2"])
    g = node("g", "127.0.0.2", port)
    many = ["127.0.0.2"] + ["127.%d.%d.%d" % (1 + i // 62500, i // 250 % 250, 1 + i % 250)
                            for i in range(9999)]
    check(len(set(many)) == 10000, "addresses not distinct")
    answer(many)
    env = shim_env()
    a = Daemon("a", SMALL + ["--admin", "--peers_dns", "svc.dns.test:%d" % port,
                             "--peers_dns_interval_ms", "500", "--peers_dns_max", "16"],
               env=env).start()
    b = Daemon("b", SMALL + ["--admin", "--peers_dns", "svc.dns.test:%d" % port,
                             "--peers_dns_interval_ms", "500", "--peers_dns_max", "65536",
                             "--max_wanted_peers", "8"], env=env).start()
    wait_for(lambda: "event=peers_dns " in a.logtext() and "event=peers_dns " in b.logtext(),
             "both resolved", dump=b.logpath)
    time.sleep(1.5 * T.SCALE)  # three more answers
    for d, cap in ((a, 16), (b, 8)):
        t = peers_table(d)
        wanted = [p for p, f in t.items() if f["wanted"] == "1"]
        check(len(t) <= cap and len(wanted) <= cap, "%s: %d peers (cap %d)" % (d.name, len(t), cap))
        code, body = d.req("/healthz")  # 200 "degraded": wanted peers nobody runs
        check(code == 200 and not body.startswith("stalled"), "%s: %d %r" % (d.name, code, body))
    check("addresses=10000 kept=16 " in a.logtext(), "a's answer line:\n" + a.logtext()[-3000:])
    check("refused_max_wanted=" in b.logtext() and "kept=10000" in b.logtext(),
          "b's answer line:\n" + b.logtext()[-3000:])
    # the good peer (sorted first) is served
    wait_for(lambda: ready(a, g.peer), "g ready on a", dump=a.logpath)
    g.req("/admin/put?first=900&count=2&request=1", "POST")
    code, body = a.req("/admin/fetch?peer=%s&first=900&count=2&request=2" % g.peer, "POST")
    check(code == 200 and "status=ok" in body, "fetch from g: %r" % body)
    check(a.req("/admin/verify?first=900&count=2")[1] == "present=2 missing=0 bad=0\n", "verify")
    for d in (a, b, g):
        d.check_clean_exit(d.stop(timeout=60))


def case_localhost():
    """The system resolver on the resolver thread: localhost:P -> 127.0.0.1:P."""
    w = Daemon("w", SMALL).start()
    port = int(w.peer.rpartition(":")[2])
    a = Daemon("a", SMALL + ["--peers_dns", "localhost:%d" % port]).start()
    wait_for(lambda: ready(a, "127.0.0.1:%d" % port), "w via localhost", dump=a.logpath)
    for d in (a, w):
        d.check_clean_exit(d.stop())


CASES = {"members": case_members, "bound": case_bound, "localhost": case_localhost}

if __name__ == "__main__":
    CASES[T.CASE]()
    print("PASS " + T.CASE)
