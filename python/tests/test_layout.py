"""The ctypes structs match include/kvpeer.h: sizes and every field offset,
checked by compiling a small C program against the real header."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from kvpeer import _lib as L

HEADER_DIR = Path(__file__).resolve().parents[2] / "include"
STRUCTS = [L.kvp_config_t, L.kvp_block_t, L.kvp_event_t, L.kvp_stats_t, L.kvp_held_item_t,
           L.kvp_peer_info_t]


def test_struct_layout_matches_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not (HEADER_DIR / "kvpeer.h").exists():
        pytest.skip("no C compiler or no source tree")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "kvpeer.h"',
             'int main(void) {']
    for st in STRUCTS:
        name = st.__name__
        lines.append(f'printf("{name} %zu\\n", sizeof({name}));')
        for f, _ in st._fields_:
            lines.append(f'printf("{name}.{f} %zu\\n", offsetof({name}, {f}));')
    lines += ['return 0;', '}']
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", str(HEADER_DIR), str(src), "-o", str(exe)], check=True)
    c_side = dict(line.split() for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    py_side = {}
    for st in STRUCTS:
        py_side[st.__name__] = str(ctypes.sizeof(st))
        for f, _ in st._fields_:
            py_side[f"{st.__name__}.{f}"] = str(getattr(st, f).offset)
    assert py_side == c_side


def test_every_header_function_is_declared():
    names = set()
    for line in (HEADER_DIR / "kvpeer.h").read_text().splitlines():
        if line.startswith("KVP_EXPORT"):
            names.add(line.split("(")[0].split()[-1].lstrip("*"))
    lib = L.lib()
    for n in names:
        assert getattr(lib, n).argtypes is not None or n == "kvp_config_init", n
