"""Read a top-level JSON array (or JSONL) one record at a time, holding about one record in memory.

LongMemEval's ``_m`` file is a JSON array of gigabytes; ``json.load`` would hold all of it (and its Python
objects, several times the bytes) at once. :func:`iter_json_array` decodes the file in chunks and
hands out each element as soon as it is complete, so a consumer that lets each record go holds one record plus
one chunk. Invalid UTF-8 survives as surrogates (``surrogateescape``) so the adapter can blame the field that
holds it, and a leading BOM is skipped.

Errors are :class:`JSONStreamError` with the element index, the character offset and line in the file, and
whether the file simply ended (``truncated``): the adapter turns them into located :class:`AdapterError`.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK_CHARS = 1 << 23  # characters per read: a LongMemEval _m record takes one or two
_WS = " \t\r\n"


@dataclass
class JSONStreamError(Exception):
    """Where and why reading stopped. ``index`` is the element being read (None before the first)."""

    index: int | None
    expected: str
    got: str
    truncated: bool

    def __str__(self) -> str:
        return f"expected {self.expected}, got {self.got}"


class _Window:
    """A sliding window of decoded text over a file: ``buf[pos:]`` is unread, ``base`` is ``buf[0]``'s offset
    in the file and ``line`` its line number. Consumed text is dropped, so the window holds the current record
    and at most one chunk beyond it."""

    def __init__(self, path: str | Path, chunk_chars: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close() when the iterator ends
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape")
        self._chunk = chunk_chars
        self.buf, self.pos, self.base, self.line = "", 0, 0, 1
        self.eof = False
        self.peak = 0  # the longest the window has been (characters), for callers that check the bound
        self._first = True

    def fill(self) -> bool:
        """Append at least one more chunk (more when the pending text is already longer, so re-parsing a record
        that spans many chunks stays linear); False at the end of the file."""
        if self.eof:
            return False
        want = max(self._chunk, len(self.buf) - self.pos)
        data = self._file.read(want)
        text = self._decoder.decode(data, final=not data)
        if self._first and text:
            text, self._first = (text[1:] if text.startswith("\ufeff") else text), False
        self.buf += text
        self.peak = max(self.peak, len(self.buf))
        if not data:
            self.eof = True
        return bool(data) or bool(text)

    def skip_ws(self) -> str | None:
        """The next non-whitespace character (not consumed), or None at the end of the file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return None

    def compact(self) -> None:
        self.line += self.buf.count("\n", 0, self.pos)
        self.base += self.pos
        self.buf, self.pos = self.buf[self.pos :], 0

    def where(self, pos: int) -> str:
        line = self.line + self.buf.count("\n", 0, pos)
        return f"line {line} (character {self.base + pos})"

    def close(self) -> None:
        self._file.close()


def _may_continue(exc: json.JSONDecodeError, length: int) -> bool:
    """Could this error come from the window ending mid-record (more text would fix it)? An error at the very
    end (an incomplete token, a split escape) or an unterminated string can; anything earlier is malformed."""
    return exc.msg.startswith("Unterminated string") or exc.pos >= length - 6


def _decode_next(win: _Window, decoder: json.JSONDecoder, index: int) -> Any:
    while True:
        try:
            value, end = decoder.raw_decode(win.buf, win.pos)
        except json.JSONDecodeError as exc:
            if _may_continue(exc, len(win.buf)) and win.fill():
                continue
            truncated = win.eof and _may_continue(exc, len(win.buf))
            raise JSONStreamError(
                index,
                "a complete JSON value",
                f"{exc.msg} at {win.where(exc.pos)}"
                + ("; the file ends inside this record (truncated file?)" if truncated else ""),
                truncated,
            ) from exc
        if end == len(win.buf) and win.fill():
            continue  # a bare number could go on in the next chunk
        win.pos = end
        return value


def iter_json_array(path: str | Path, chunk_chars: int = CHUNK_CHARS) -> Iterator[tuple[int, Any]]:
    """Yield ``(index, element)`` of the top-level JSON array in ``path``; raise :class:`JSONStreamError` at
    the first element that cannot be read (the elements before it have been yielded)."""
    win = _Window(path, chunk_chars)
    try:
        decoder = json.JSONDecoder()
        first = win.skip_ws()
        if first != "[":
            got = "an empty file" if first is None else repr(win.buf[win.pos : win.pos + 20])
            raise JSONStreamError(None, "a JSON array of records (file starting with '[')", got, False)
        win.pos += 1
        if win.skip_ws() == "]":
            return
        index = 0
        while True:
            if win.skip_ws() is None:
                raise JSONStreamError(index, "a complete JSON value", "end of file (truncated file?)", True)
            value = _decode_next(win, decoder, index)
            yield index, value
            win.compact()
            index += 1
            nxt = win.skip_ws()
            if nxt == ",":
                win.pos += 1
                continue
            if nxt == "]":
                return
            got = "end of file (truncated file?)" if nxt is None else repr(win.buf[win.pos : win.pos + 20])
            raise JSONStreamError(index, "',' or ']' after a record", got, nxt is None)
    finally:
        win.close()


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, int, Any | json.JSONDecodeError]]:
    """Yield ``(index, line number, value or the decode error)`` for each non-blank line of a JSONL file."""
    index = 0
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                value: Any = json.loads(line)
            except json.JSONDecodeError as exc:
                value = exc
            yield index, lineno, value
            index += 1


__all__ = ["CHUNK_CHARS", "JSONStreamError", "iter_json_array", "iter_json_lines"]
