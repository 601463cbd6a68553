"""Typed helpers that read settings from the environment (a `*_FILE` variant holds secrets)."""

from __future__ import annotations

import os
from pathlib import Path


def env_str(name: str, default: str = "") -> str:
    path = os.environ.get(f"{name}_FILE")
    if path:
        return Path(path).read_text(encoding="utf-8").strip()
    return os.environ.get(name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return default if raw in (None, "") else int(raw)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return default if raw in (None, "") else float(raw)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_rate(rate: str) -> tuple[int, int]:
    """A rate setting as DRF writes it: '600/minute' -> (600, 60)."""
    count, _sep, period = rate.partition("/")
    return int(count), _PERIODS[period.strip()[:1]]
