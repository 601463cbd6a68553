"""xsd:duration and xsd:dateTime as used by InitialTerminationTime and Renew."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

_DURATION_RE = re.compile(
    r"^(?P<sign>-)?P(?:(?P<y>\d+)Y)?(?:(?P<mo>\d+)M)?(?:(?P<w>\d+)W)?(?:(?P<d>\d+)D)?"
    r"(?:T(?:(?P<h>\d+)H)?(?:(?P<mi>\d+)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


class TimeValueError(ValueError):
    """Neither a valid xsd:duration nor an xsd:dateTime."""


def parse_duration(text: str) -> timedelta:
    m = _DURATION_RE.match(text.strip())
    if not m or text.strip() in ("P", "-P") or text.strip().endswith("T"):
        raise TimeValueError(f"'{text}' is not an xsd:duration")
    g = {k: v for k, v in m.groupdict().items() if v is not None}
    # Years and months have no fixed length; a broker approximates them as 365 and 30 days.
    days = int(g.get("y", 0)) * 365 + int(g.get("mo", 0)) * 30 + int(g.get("w", 0)) * 7
    days += int(g.get("d", 0))
    delta = timedelta(
        days=days,
        hours=int(g.get("h", 0)),
        minutes=int(g.get("mi", 0)),
        seconds=float(g.get("s", 0)),
    )
    return -delta if g.get("sign") else delta


def parse_datetime(text: str) -> datetime:
    raw = text.strip()
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise TimeValueError(f"'{text}' is not an xsd:dateTime") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # xsd:dateTime without a zone: read as UTC
    try:
        # In UTC, as it is stored: 9999-12-31T23:59:59-14:00 is in year 10000, which the database
        # takes but cannot give back, so that every later read of the table failed.
        return value.astimezone(UTC)
    except OverflowError:
        raise TimeValueError(f"'{text}' lies after the last instant of year 9999 (UTC)") from None


def parse_termination(text: str, *, now: datetime) -> datetime:
    """An absolute time from a duration (relative to now) or a dateTime."""
    raw = (text or "").strip()
    if not raw:
        raise TimeValueError("the termination time is empty")
    if raw.lstrip("-").startswith("P"):
        try:
            return now + parse_duration(raw)
        except OverflowError:
            raise TimeValueError(f"'{text}' is too far in the future") from None
    return parse_datetime(raw)


def format_datetime(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
