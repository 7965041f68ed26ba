"""vLLM's own tiering tests, tier rebound to kvpeer (issue 28, build item 6).

    python run_suite.py [--dest build/vllm-sdist] [pytest args...]

Fetches the sdist of the vLLM installed in this python (fetch_sdist.py,
cached under --dest), runs FILES of its tests/v1/kv_offload/tiering/ with
the kvpeer_rebind plugin, and prints the table (test -> pass/fail/skip/xfail
+ reason). Exit: pytest's status; SKIP (77) only when this python has no
vllm or the package index cannot be reached, saying which.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYDIR = HERE.parent.parent  # python/: the kvpeer package
SKIP = 77
# The files whose tiers are built as ExampleSecondaryTierManager (rebound).
# The other files of the directory test vLLM's own machinery with their own
# fake tiers (poll thread, metrics tracker, backpressure, async lookup) or
# vLLM's fs/obj/kvcr/p2p tiers: there is no tier fixture to rebind in them.
FILES = ("test_tiering_offloading.py", "test_factory.py")


def main() -> int:
    args = sys.argv[1:]
    dest = PYDIR.parent / "build" / "vllm-sdist"
    if args[:1] == ["--dest"]:
        dest, args = Path(args[1]), args[2:]
    try:
        import vllm.v1.kv_offload.tiering.example.manager  # noqa: F401
    except ImportError as e:
        print(f"SKIP: no vllm in {sys.executable} ({e}); scripts/install-py.sh makes .venv")
        return SKIP
    sys.path.insert(0, str(HERE))
    import fetch_sdist
    dest.mkdir(parents=True, exist_ok=True)
    try:
        v = fetch_sdist.installed_version()
        root = fetch_sdist.extract(fetch_sdist.download(v, dest), dest, v)
    except fetch_sdist.Offline as e:
        print(f"SKIP: vLLM's sdist cannot be fetched (offline?): {e}")
        return SKIP
    tdir = root / "tests" / "v1" / "kv_offload" / "tiering"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root), str(HERE), str(PYDIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("UCX_NET_DEVICES", "lo")
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    print(f"vllm {v}: {tdir.relative_to(dest)} under {dest}", flush=True)
    cmd = [sys.executable, "-m", "pytest", "-p", "kvpeer_rebind", "-p", "no:cacheprovider",
           "-q", "-rfE", f"--rootdir={root}", "-o", "faulthandler_timeout=60",
           *[str(tdir / f) for f in FILES], *args]
    return subprocess.call(cmd, cwd=str(root), env=env)


if __name__ == "__main__":
    sys.exit(main())
