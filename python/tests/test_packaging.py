"""`pip install` of the package works offline, and the library search order."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvpeer import _lib as L

PKG = Path(__file__).resolve().parents[1]


def test_pip_install_offline(tmp_path):
    """pip (Debian's) builds and installs the package with no index and no
    build isolation; the installed copy finds the library via KVPEER_LIB."""
    pytest.importorskip("setuptools", reason="python3-setuptools is not installed")
    src = tmp_path / "src"  # a copy: in-tree builds would litter the source tree
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info",
                                                            "__pycache__"))
    target = tmp_path / "site"
    pip_env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=120, env=pip_env)
    if r.returncode != 0 and "No module named pip" in r.stderr:
        pytest.skip("python3-pip is not installed")
    assert r.returncode == 0, r.stderr[-2000:]
    code = ("import kvpeer, sys; n = kvpeer.Node(num_blocks=8, block_size=65536); "
            "print(kvpeer.__file__, kvpeer.lib_path()); n.close()")
    env = {k: v for k, v in os.environ.items() if k not in ("KVPEER_BUILD_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(target), KVPEER_LIB=L.lib_path() or L.find_library())
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    where, lib = r.stdout.split()
    assert where.startswith(str(target)) and lib == env["KVPEER_LIB"]


def test_library_search_order(tmp_path, monkeypatch):
    real = L.lib_path() or L.find_library()
    monkeypatch.setenv("KVPEER_LIB", real)
    assert L.find_library() == real
    monkeypatch.delenv("KVPEER_LIB")
    monkeypatch.setenv("KVPEER_BUILD_DIR", str(Path(real).parent))
    assert L.find_library() == str(Path(real).parent / "libkvpeer.so")
    monkeypatch.delenv("KVPEER_BUILD_DIR")
    found = L.find_library()  # the source tree's build dirs, or the system
    assert found.endswith("libkvpeer.so") or "kvpeer" in found
    monkeypatch.setenv("KVPEER_LIB", str(tmp_path / "missing.so"))
    monkeypatch.setattr(L, "_package_build_candidates", lambda: iter(()))
    monkeypatch.setattr(L.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(OSError, match="missing.so"):
        L.find_library()
