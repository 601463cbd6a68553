"""Few malloc arenas in every HPwsn process (glibc only).

glibc gives each thread that allocates an arena of its own, up to eight per core. A worker's
pool process runs a dozen threads (the pump threads, the loop, the event log), and the payloads
it pushes are allocated by whichever thread reads them and freed by another: every arena keeps
its high-water mark and its holes, so the RSS of a pool process crept up by about 0.5 MB a minute
in the one-hour soak. With two arenas it stays flat (docs/benchmarks.md, "RSS and the malloc
arenas").

The limit has to be set before the process has more than a few threads, so it is set when
`hpwsn_site` is imported: before Celery, uvicorn or Django start any. A `MALLOC_ARENA_MAX` in
the environment is glibc's own setting and wins (glibc has read it already).
"""

from __future__ import annotations

import ctypes
import os
import sys

ARENAS = 2
_M_ARENA_MAX = -8  # malloc.h


def arenas_limit(arenas: int = ARENAS) -> bool:
    """Ask glibc for at most `arenas` malloc arenas; whether the limit was set here."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        # The process's own symbols, libc's among them (find_library would run ldconfig at the
        # start of every process).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # another C library (musl has no arenas to limit)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, arenas))
