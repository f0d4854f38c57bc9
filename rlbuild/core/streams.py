"""Append-only text in storage: a stream is a folder of numbered segment objects that only ever grows.

Object stores cannot append, and rewriting a whole log or metrics file at every line costs a quadratic number of
bytes over a long run. A writer buffers lines and, every `flush_s` seconds (and when it closes), writes the new
lines as the next segment `part-000001`, `part-000002`, ...; a segment is never rewritten. A reader lists the
segments in order and concatenates them, so it sees every flushed line, also while the writer runs.
"""

from __future__ import annotations

import re
import time
from types import TracebackType

from rlbuild.core import storage

SEGMENT = re.compile(r"^part-(\d{6,})$")


class StreamWriter:
    """Appends lines to the stream at `uri`, continuing after the segments already there."""

    def __init__(self, uri: str, flush_s: float = 30.0) -> None:
        self.uri, self.flush_s = uri, flush_s
        self.buffer: list[str] = []
        self.next_segment = max((int(m[1]) for n in storage.list_names(uri) if (m := SEGMENT.match(n))), default=0)
        self.last_flush = time.monotonic()

    def write(self, text: str) -> None:
        self.buffer.append(text)
        if time.monotonic() - self.last_flush >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.buffer:
            return
        self.next_segment += 1
        storage.write_text(storage.join(self.uri, f"part-{self.next_segment:06d}"), "".join(self.buffer))
        self.buffer.clear()

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def read_stream(uri: str) -> str | None:
    """Every flushed line of the stream at `uri`, in order; None when there is no stream there."""
    segments = sorted((int(m[1]), n) for n in storage.list_names(uri) if (m := SEGMENT.match(n)))
    if not segments:
        return None
    return "".join(storage.read_text(storage.join(uri, name)) or "" for _, name in segments)
