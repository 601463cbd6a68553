"""Every HPwsn process keeps to two malloc arenas, however many threads allocate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Twelve threads allocate at once, then glibc's malloc_info names the arenas (one <heap> each).
PROBE = r"""
import ctypes, tempfile, threading
import hpwsn_site

libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
together = threading.Barrier(12)
kept = []

def allocate():
    together.wait()
    kept.append([bytearray(4096) for _ in range(100)])
    together.wait()

threads = [threading.Thread(target=allocate) for _ in range(12)]
for t in threads:
    t.start()
for t in threads:
    t.join()
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(open(out.name).read().count("<heap nr="))
"""


def _arenas(env: dict[str, str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_a_process_keeps_to_two_arenas_unless_the_environment_says_otherwise():
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    assert _arenas(env) <= 2
    # The probe does see arenas: with glibc's own setting the threads get one each.
    assert _arenas({**env, "MALLOC_ARENA_MAX": "16"}) > 2
