"""The thesis's fragmentation (5.3.3.4): split a message payload, render and reassemble fragments.

A fragment travels as one NotificationMessage with a header

    <wsnt:Package><Identification>ID</Identification><Fragment>F-M-P-OFFSET</Fragment></wsnt:Package>

(F: fragmented, M: more fragments follow, P: partial delivery allowed, OFFSET: 0..99999, the index
of the fragment counted from the first). The thesis cut the serialized message string (figure
5-14); here the payload is the serialized inner content of `wsnt:Message`, cut into pieces of at
most `fragment_size` bytes on UTF-8 character boundaries, and each piece is carried as the escaped
text of its fragment's `wsnt:Message`. Concatenating the texts of all fragments in offset order
gives back the payload bytes exactly. Pure: no Django, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from xml.sax.saxutils import escape

MAX_OFFSET = 99_999  # five decimal digits (thesis figure 5-13)
MAX_FRAGMENTS = 99_999  # at most this many fragments per message
MIN_FRAGMENT_SIZE = 4  # the longest UTF-8 character, so every fragment carries at least one

_FLAGS = re.compile(r"([01])-([01])-([01])-([0-9]+)", re.ASCII)
# Text is escaped so that an XML parser hands it back unchanged: & < > as entities, and CR as a
# character reference (a literal CR would be normalised to LF by the receiving parser).
_TEXT_ENTITIES = {"\r": "&#13;"}


class FragmentError(ValueError):
    """A fragment, its flags or a split that cannot be; the message says why."""


class FragmentConflict(FragmentError):
    """A fragment that contradicts fragments already received for the same message."""


class FragmentLimit(FragmentError):
    """A message that would need more fragments or bytes than allowed."""


@dataclass(frozen=True, slots=True)
class Flags:
    fragmented: bool
    more: bool
    partial_allowed: bool
    offset: int

    def __str__(self) -> str:
        return format_flags(self.fragmented, self.more, self.partial_allowed, self.offset)


def format_flags(fragmented: bool, more: bool, partial_allowed: bool, offset: int) -> str:
    """The text of a <Fragment> element: F-M-P-OFFSET."""
    if not 0 <= offset <= MAX_OFFSET:
        raise FragmentError(f"fragment offset {offset} is outside 0..{MAX_OFFSET}")
    return f"{int(fragmented)}-{int(more)}-{int(partial_allowed)}-{offset}"


def _clip(text: str, limit: int = 40) -> str:
    """Untrusted text as quoted in a fault: a fault must not echo a megabyte back."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_flags(text: str) -> Flags:
    """Read F-M-P-OFFSET; flags are 0 or 1, the offset 0..99999."""
    m = _FLAGS.fullmatch(text.strip())
    if m is None:
        raise FragmentError(f"Fragment '{_clip(text)}' is not of the form F-M-P-OFFSET (flags 0/1)")
    digits = m.group(4).lstrip("0") or "0"
    if len(digits) > len(str(MAX_OFFSET)) or int(digits) > MAX_OFFSET:
        raise FragmentError(f"fragment offset {_clip(m.group(4))} exceeds {MAX_OFFSET}")
    return Flags(m.group(1) == "1", m.group(2) == "1", m.group(3) == "1", int(digits))


def escape_text(data: bytes) -> str:
    """Fragment bytes as XML character data that a parser turns back into the same bytes."""
    return escape(data.decode("utf-8"), _TEXT_ENTITIES)


def package_xml(identification: str, flags: Flags | str) -> str:
    """The wsnt:Package header (children unqualified, as in the thesis); `wsnt` must be in scope."""
    return (
        f"<wsnt:Package><Identification>{escape(identification)}</Identification>"
        f"<Fragment>{flags}</Fragment></wsnt:Package>"
    )


@dataclass(frozen=True, slots=True)
class Fragment:
    identification: str
    offset: int
    more: bool
    partial_allowed: bool
    data: bytes  # a piece of the payload, whole UTF-8 characters

    @property
    def flags(self) -> Flags:
        return Flags(True, self.more, self.partial_allowed, self.offset)

    def package_xml(self) -> str:
        return package_xml(self.identification, self.flags)

    def message_xml(self) -> str:
        """The fragment's wsnt:Message: the piece as escaped text."""
        return f"<wsnt:Message>{escape_text(self.data)}</wsnt:Message>"


def from_parts(*, identification: str, flags: str, text: str) -> Fragment:
    """A received fragment: the Package's Identification and Fragment, and its Message's text."""
    parsed = parse_flags(flags)
    if not parsed.fragmented:
        raise FragmentError(f"Fragment '{flags}' does not mark a fragment (F=0)")
    return Fragment(
        identification, parsed.offset, parsed.more, parsed.partial_allowed, text.encode()
    )


def split(
    payload: bytes, *, fragment_size: int, identification: str, partial_allowed: bool
) -> list[Fragment]:
    """Cut a payload into fragments of at most `fragment_size` bytes, never inside a character."""
    if fragment_size < MIN_FRAGMENT_SIZE:
        raise FragmentError(f"fragment size {fragment_size} is below {MIN_FRAGMENT_SIZE} bytes")
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FragmentError(f"the payload is not UTF-8: {exc}") from None
    pieces: list[bytes] = []
    start = 0
    while True:
        end = min(start + fragment_size, len(payload))
        # Back off to the start of a character: UTF-8 continuation bytes are 0b10xxxxxx.
        while end < len(payload) and payload[end] & 0xC0 == 0x80:
            end -= 1
        pieces.append(payload[start:end])
        if len(pieces) > MAX_FRAGMENTS:
            raise FragmentLimit(
                f"a payload of {len(payload)} bytes needs more than {MAX_FRAGMENTS} fragments "
                f"of {fragment_size} bytes"
            )
        start = end
        if start >= len(payload):
            break
    last = len(pieces) - 1
    return [
        Fragment(identification, i, i < last, partial_allowed, piece)
        for i, piece in enumerate(pieces)
    ]


class Reassembler:
    """Collects the fragments of one message in any order and tells when it is whole."""

    def __init__(self, *, max_fragments: int = MAX_FRAGMENTS, max_bytes: int | None = None) -> None:
        self.identification: str | None = None
        self.max_fragments = max_fragments
        self.max_bytes = max_bytes
        self._pieces: dict[int, bytes] = {}
        self._last: int | None = None  # offset of the fragment with M=0, once seen
        self._bytes = 0

    @property
    def received(self) -> int:
        return len(self._pieces)

    @property
    def expected(self) -> int | None:
        """How many fragments the message has, once its last fragment arrived."""
        return None if self._last is None else self._last + 1

    @property
    def complete(self) -> bool:
        return self._last is not None and len(self._pieces) == self._last + 1

    @property
    def size(self) -> int:
        return self._bytes

    def missing(self) -> list[int]:
        """Offsets not received below the last (or the highest) offset seen."""
        top = self._last if self._last is not None else max(self._pieces, default=-1)
        return [i for i in range(top + 1) if i not in self._pieces]

    def add(self, fragment: Fragment) -> bool:
        """Add a fragment; False if it is a duplicate of one already held (same offset and data)."""
        if self.identification is None:
            self.identification = fragment.identification
        elif fragment.identification != self.identification:
            raise FragmentConflict(
                f"fragment of '{fragment.identification}' given to the reassembly of "
                f"'{self.identification}'"
            )
        off = fragment.offset
        held = self._pieces.get(off)
        if held is not None:
            if held == fragment.data:
                return False
            raise FragmentConflict(
                f"offset {off} of '{self.identification}' was already received with other content"
            )
        if self._last is not None and off > self._last:
            raise FragmentConflict(
                f"offset {off} of '{self.identification}' lies beyond its last fragment "
                f"(offset {self._last})"
            )
        top = max(self._pieces, default=-1)
        if not fragment.more and top > off:
            raise FragmentConflict(
                f"offset {off} of '{self.identification}' says it is the last fragment, but "
                f"offset {top} was received"
            )
        if off >= self.max_fragments:
            raise FragmentLimit(
                f"offset {off} of '{self.identification}' exceeds the limit of "
                f"{self.max_fragments} fragments per message"
            )
        size = self._bytes + len(fragment.data)
        if self.max_bytes is not None and size > self.max_bytes:
            raise FragmentLimit(
                f"the reassembly of '{self.identification}' would hold {size} bytes, more than "
                f"the limit of {self.max_bytes} bytes"
            )
        self._pieces[off] = fragment.data
        self._bytes = size
        if not fragment.more:
            self._last = off
        return True

    def payload(self) -> bytes:
        """The whole payload, fragments concatenated in offset order."""
        if not self.complete:
            raise FragmentError(
                f"the reassembly of '{self.identification}' misses offsets {self.missing()[:10]}"
                + ("" if self._last is not None else " and its last fragment")
            )
        return b"".join(self._pieces[i] for i in range(len(self._pieces)))
