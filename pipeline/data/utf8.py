"""Text that is not valid UTF-8: lines split and decoded so that bad rows are counted and
skipped instead of failing the whole read.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INVALID_UTF8 = "invalid_utf8"
"""Bool column the readers add: the row's text was not valid UTF-8 (its ``text`` is empty)."""


def stable_row_id(text: str) -> int:
    """63-bit content hash: the same sentence gets the same id in every run and on every node."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


def text_ids(texts: pa.Array, chunk: int = 65_536) -> np.ndarray:
    """:func:`stable_row_id` of each text, -1 for an empty one, a chunk of Python strings at a
    time (never all of them at once)."""
    ids = np.empty(len(texts), dtype=np.int64)
    for start in range(0, len(texts), chunk):
        part = texts.slice(start, chunk).to_pylist()
        ids[start : start + len(part)] = [stable_row_id(t) if t else -1 for t in part]
    return ids


def split_utf8_lines(data: bytes) -> tuple[list[str], list[bool] | None]:
    """The lines of a file's bytes, as ``read_text`` splits them, and which were not UTF-8.

    Returns ``(lines, invalid)``; ``invalid`` is None when every line decoded. An undecodable
    line becomes ``""`` flagged True. UTF-8 never uses a newline byte inside a multi-byte
    character, so decoding line by line finds exactly the bad lines.
    """
    try:
        return data.decode("utf-8").splitlines(), None
    except UnicodeDecodeError:
        pass
    lines: list[str] = []
    invalid: list[bool] = []
    for raw in data.splitlines():
        try:
            # str.splitlines also splits on \v, \f, U+2028, ...: as the whole-file path does.
            parts = raw.decode("utf-8").splitlines() or [""]
        except UnicodeDecodeError:
            parts = None
        if parts is None:
            lines.append("")
            invalid.append(True)
        else:
            lines.extend(parts)
            invalid.extend([False] * len(parts))
    return lines, invalid


READ_CHUNK_BYTES = 32 * 2**20
"""Bytes of a text file read and split at once: a read task holds a few times this (the bytes,
their lines as Python strings, the Arrow column), whatever the file's size. Whole, a 10M-line
file of 838 MB took one read task to 3 GiB."""


def utf8_line_tables(f: Any, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[pa.Table]:
    """The lines of a binary file object (``text`` and :data:`INVALID_UTF8`), a table for each
    ``chunk_bytes`` or so, cut after a newline byte: the same lines as the whole file split at
    once (``\\r\\n`` stays whole, and no UTF-8 character holds a newline byte)."""
    rest = b""
    yielded = False
    while data := f.read(chunk_bytes):
        data = rest + data
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield _lines_table(data[:cut])
            yielded = True
    if rest or not yielded:
        yield _lines_table(rest)


def _lines_table(data: bytes) -> pa.Table:
    lines, invalid = split_utf8_lines(data)
    flags = pa.array(invalid if invalid is not None else np.zeros(len(lines), dtype=bool), pa.bool_())
    return pa.table({"text": pa.array(lines, pa.string()), INVALID_UTF8: flags})


@functools.cache
def _utf8_lines_datasource() -> type:
    """A ``read_text`` datasource that skips undecodable lines instead of failing the file, and
    reads a file a chunk at a time (:func:`utf8_line_tables`).

    Ray's own reader decodes a whole file at once, so one bad byte in a 10M-line crawl
    fails the job. Built on first use so that importing this module does not import Ray Data.
    """
    from ray.data.datasource import FileBasedDatasource  # deferred: see the docstring

    class Utf8LinesDatasource(FileBasedDatasource):
        def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
            yield from utf8_line_tables(f)

    return Utf8LinesDatasource


def decode_utf8(column: Any) -> tuple[pa.Array, pa.Array]:
    """A binary column as strings, and a bool column marking values that are not UTF-8
    (they become null). One vectorised cast when the whole column is valid."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    try:
        return pc.cast(column, pa.string()), pa.array(np.zeros(len(column), dtype=bool))
    except pa.ArrowInvalid:
        pass
    texts: list[str | None] = []
    invalid: list[bool] = []
    for value in column.to_pylist():
        try:
            texts.append(None if value is None else value.decode("utf-8"))
            invalid.append(False)
        except UnicodeDecodeError:
            texts.append(None)
            invalid.append(True)
    return pa.array(texts, pa.string()), pa.array(invalid, pa.bool_())


def _as_text(column: Any) -> tuple[Any, Any]:
    """``(strings, not-UTF-8 flags or None)`` for a sentence column of any accepted type."""
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return decode_utf8(column)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = pc.cast(column, pa.string())
    return column, None
