#!/usr/bin/env python3
"""test_readme_example.py -- the C API's example program, compiled and run.

    test_readme_example.py KVPEERD LIBDIR SOURCE_DIR "SANITIZE_FLAGS"

The README's first ```c block is an excerpt of the program (issue 31: the
README a front door): each of its lines but the `/* ...` elisions must be a
line of the program, in order (spaces aside). The program, the first ```c
block of docs/API.md, is extracted verbatim, compiled against
include/kvpeer.h and the built libkvpeer (with the build's sanitizers, if
any), starts a kvpeerd holding two blocks, and runs the example against it
with two keys that hit and one that misses: it must connect (kvp_peer_wait),
see 2 of 3 hits, load the 2 hits (the miss does not fail them) and read them.
Then the same example with its kvp_peer_wait block cut out (issue 18: a
lookup right after kvp_peer_add waits for the dialing peer) must print the
same.
"""
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

KVPEERD, LIBDIR, SRC = (os.path.abspath(a) for a in sys.argv[1:4])
SAN = sys.argv[4].split() if len(sys.argv) > 4 else []
SCALE = float(os.environ.get("KVPEER_TEST_TIME_SCALE", "1"))
TMP = tempfile.mkdtemp(prefix="kvp-readme-")
CHILDREN = []


def cleanup():
    for p in CHILDREN:
        if p.poll() is None:
            p.kill()
            p.wait()
    shutil.rmtree(TMP, ignore_errors=True)


atexit.register(cleanup)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def c_block(rel):
    m = re.search(r"```c\n(.*?)```", open(os.path.join(SRC, rel)).read(), re.S)
    if not m:
        fail(rel + " has no ```c block")
    return m.group(1)


code = c_block(os.path.join("docs", "API.md"))
prog = [" ".join(ln.split()) for ln in code.splitlines()]
at = 0
for ln in c_block("README.md").splitlines():
    ln = " ".join(ln.split())
    if not ln or ln.startswith("/* ..."):
        continue
    try:
        at = prog.index(ln, at) + 1
    except ValueError:
        fail("the README's C excerpt line %r is not a line of docs/API.md's program "
             "(in order)" % ln)
# The variant without kvp_peer_wait: its call and the if-block after it.
nowait, k = re.subn(r"\n *kvp_status_t st = kvp_peer_wait\(.*?\n    \}\n", "\n    kvp_status_t st;\n",
                    code, flags=re.S)
if k != 1 or "kvp_peer_wait(" in nowait:
    fail("cannot cut the kvp_peer_wait block out of the example program")
cc = os.environ.get("CC", "cc")
exes = []
for name, text in (("example", code), ("example_nowait", nowait)):
    src = os.path.join(TMP, name + ".c")
    open(src, "w").write(text)
    exe = os.path.join(TMP, name)
    r = subprocess.run([cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Werror", *SAN,
                        "-I", os.path.join(SRC, "include"), src, "-o", exe, "-L", LIBDIR,
                        "-lkvpeer", "-Wl,-rpath," + LIBDIR], capture_output=True, text=True)
    if r.returncode != 0:
        fail("the example program (%s) does not compile:\n%s" % (name, r.stderr))
    exes.append(exe)

ready = os.path.join(TMP, "d.ready")
log = open(os.path.join(TMP, "d.log"), "w")
token = os.urandom(24).hex()  # --admin needs a 0600 token file (issue 27)
token_file = os.path.join(TMP, "admin.token")
with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
    f.write(token + "\n")
d = subprocess.Popen([KVPEERD, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin",
                      "--admin_token_file", token_file,
                      "--compat", "llama-70b/fp16/tp8", "--num_blocks", "64",
                      "--block_size", "256K", "--ready_file", ready],
                     stdout=log, stderr=subprocess.STDOUT)
CHILDREN.append(d)
end = time.time() + 30 * SCALE
while not os.path.exists(ready):
    if d.poll() is not None or time.time() > end:
        fail("kvpeerd not ready:\n" + open(log.name).read())
    time.sleep(0.05)
time.sleep(0.05)
fields = dict(kv.split("=", 1) for kv in open(ready).read().split())
req = urllib.request.Request("http://%s/admin/put?first=0&count=2" % fields["http"],
                             method="POST", data=b"",
                             headers={"Authorization": "Bearer " + token})
with urllib.request.urlopen(req, timeout=30 * SCALE) as resp:
    body = resp.read().decode()
if "put 2 0" not in body:
    fail("put: " + body)

# Run it right after the daemon is up: no sleep, the example must wait itself.
for exe in exes:
    r = subprocess.run([exe, fields["peer"], "blk-00000000", "blk-00000007", "blk-00000001"],
                       capture_output=True, text=True, timeout=120 * SCALE)
    out = r.stdout
    print(os.path.basename(exe) + ":\n" + out + r.stderr[-4000:])
    if r.returncode != 0:
        fail("%s exited %d" % (os.path.basename(exe), r.returncode))
    for want in ("lookup: 2 of 3 keys hit", "load: 2 of 3 blocks",
                 "blk-00000000: 262144 bytes", "blk-00000001: 262144 bytes"):
        if want not in out:
            fail("%s: missing in the output: %r" % (os.path.basename(exe), want))
    if "blk-00000007:" in out:
        fail("the missed key was reported as loaded")
d.terminate()
if d.wait(60 * SCALE) != 0:
    fail("kvpeerd exit code %d:\n%s" % (d.returncode, open(log.name).read()[-4000:]))
print("ok")
