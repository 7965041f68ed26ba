"""Fetch vLLM's own tiering tests from the source distribution of the vLLM
version installed in this python (issue 28, build item 6). Never vendored:
the sdist is downloaded at test time from the package index pip is
configured with ($PIP_INDEX_URL, else pip's default index), checked
against the index's sha256, cached, and only tests/v1/kv_offload/tiering/
(plus the few tests/ helper modules those files import) is extracted.

    python fetch_sdist.py DEST_DIR      -> prints the extracted tests root

Exit status: 0 extracted (or cached), 3 offline / index unreachable
(the caller skips, saying why), 1 anything else (a real error).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tarfile
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Optional, Tuple

OFFLINE = 3
SUBTREE = "tests/v1/kv_offload/tiering/"
# tests/ modules the tiering tests (or their conftest) may import; taken if
# present in the sdist, so an import of one of them does not fail on a path.
HELPERS = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/kv_offload/__init__.py",
           "tests/v1/kv_offload/utils.py", "tests/v1/kv_offload/conftest.py")


class Offline(Exception):
    pass


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if url:
        return url.rstrip("/")
    from pip._internal.models.index import PyPI  # pip's own default index
    return PyPI.simple_url.rstrip("/")


def _get(url: str, accept: str, timeout: float = 60.0) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "kvpeer-tests"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except OSError as e:  # URLError, timeouts, DNS: the index cannot be reached
        raise Offline(f"{url}: {getattr(e, 'reason', e)}") from None


def sdist_url(version: str) -> Tuple[str, Optional[str]]:
    """(url, sha256) of vllm-<version>.tar.gz from the simple index (PEP 691 JSON)."""
    base = index_url() + "/vllm/"
    data = json.loads(_get(base, "application/vnd.pypi.simple.v1+json"))
    want = f"vllm-{version}.tar.gz"
    for f in data.get("files", []):
        if f.get("filename") == want:
            return urllib.parse.urljoin(base, f["url"]), (f.get("hashes") or {}).get("sha256")
    raise RuntimeError(f"the index {base} lists no {want}")


def download(version: str, cache: Path) -> Path:
    tgz = cache / f"vllm-{version}.tar.gz"
    if tgz.exists():
        return tgz
    url, sha = sdist_url(version)
    tmp = tgz.with_suffix(".part")
    h = hashlib.sha256()
    req = urllib.request.Request(url, headers={"User-Agent": "kvpeer-tests"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r, open(tmp, "wb") as out:
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                h.update(b)
                out.write(b)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise Offline(f"{url}: {getattr(e, 'reason', e)}") from None
    if sha and h.hexdigest() != sha:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{url}: sha256 {h.hexdigest()} is not the index's {sha}")
    tmp.rename(tgz)
    return tgz


def extract(tgz: Path, dest: Path, version: str) -> Path:
    """Extract SUBTREE and HELPERS under dest/vllm-<version>/; returns that root."""
    root = dest / f"vllm-{version}"
    stamp = root / ".extracted"
    if stamp.exists():
        return root
    prefix = f"vllm-{version}/"
    with tarfile.open(tgz) as t:
        def wanted(m: tarfile.TarInfo) -> bool:
            rel = m.name[len(prefix):]
            return (m.isfile() and m.name.startswith(prefix) and ".." not in m.name.split("/")
                    and (rel.startswith(SUBTREE) or rel in HELPERS))

        members = [m for m in t.getmembers() if wanted(m)]
        if not any(m.name[len(prefix):].startswith(SUBTREE) for m in members):
            raise RuntimeError(f"{tgz.name} holds no {SUBTREE}")
        # Regular files under one prefix, no "..": safe without tarfile's
        # extraction filter (python < 3.11.4 has none).
        for m in members:
            m.mode = 0o644
        t.extractall(dest, members=members)
    stamp.write_text(tgz.name + "\n")
    return root


def installed_version() -> str:
    from importlib.metadata import version
    return version("vllm")


def main() -> int:
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "build/vllm-sdist").resolve()
    dest.mkdir(parents=True, exist_ok=True)
    try:
        v = installed_version()
        root = extract(download(v, dest), dest, v)
    except Offline as e:
        print(f"offline: {e}", file=sys.stderr)
        return OFFLINE
    print(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
