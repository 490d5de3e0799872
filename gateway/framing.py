"""Sans-IO message body framing: where a request or response body ends (RFC 9112 §6).

The forward path relays bodies byte for byte (chunked stays chunked); a framer only
says how many of the bytes at hand belong to the current message and when it is done,
so the next message on a kept-alive connection starts at the right byte.

    request:  Transfer-Encoding: chunked  -> Chunked
              Content-Length: n           -> Length(n)
              neither                     -> Length(0)
              both, or differing lengths  -> 400 (request smuggling, §6.3)
    response: HEAD, 1xx, 204, 304         -> Length(0)
              chunked / Content-Length    -> as above
              neither                     -> UntilClose
"""

from __future__ import annotations

from typing import Final, Protocol

from gateway.parser import RequestHead, RequestRejected, ResponseHead

__all__ = [
    "Chunked",
    "Framer",
    "Length",
    "UntilClose",
    "request_framer",
    "response_framer",
]

_MAX_CHUNK_LINE: Final = 4096


class Framer(Protocol):
    done: bool

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """How many leading bytes of ``data`` belong to this body (sets ``done`` at the end)."""
        ...


class Length:
    __slots__ = ("done", "remaining")

    def __init__(self, length: int) -> None:
        self.remaining = length
        self.done = length == 0

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        take = min(self.remaining, len(data))
        self.remaining -= take
        self.done = self.remaining == 0
        return take


class UntilClose:
    """A response body that ends when the upstream closes."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        return len(data)


class Chunked:
    """Chunked transfer coding: ``size[;ext] CRLF data CRLF ... 0 CRLF trailers CRLF``."""

    __slots__ = ("_line", "_remaining", "_state", "done")

    def __init__(self) -> None:
        self._state = "size"  # size | data | data_end | trailer
        self._line = bytearray()
        self._remaining = 0
        self.done = False

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        buf = bytes(data)
        pos = 0
        n = len(buf)
        while pos < n and not self.done:
            if self._state == "data":
                take = min(self._remaining, n - pos)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = "data_end"
                continue
            # line states: size, data_end, trailer
            nl = buf.find(b"\n", pos)
            if nl < 0:
                self._line += buf[pos:]
                pos = n
                if len(self._line) > _MAX_CHUNK_LINE:
                    raise RequestRejected(400, "chunk line too long")
                break
            self._line += buf[pos:nl]
            pos = nl + 1
            line = bytes(self._line).rstrip(b"\r")
            self._line.clear()
            self._on_line(line)
        return pos

    def _on_line(self, line: bytes) -> None:
        if self._state == "size":
            size_text = line.split(b";", 1)[0].strip(b" \t")
            if not size_text or len(size_text) > 16:
                raise RequestRejected(400, "malformed chunk size")
            try:
                size = int(size_text, 16)
            except ValueError:
                raise RequestRejected(400, "malformed chunk size") from None
            if size_text[:1] in (b"+", b"-") or size < 0:
                raise RequestRejected(400, "malformed chunk size")
            if size == 0:
                self._state = "trailer"
            else:
                self._remaining = size
                self._state = "data"
        elif self._state == "data_end":
            if line:
                raise RequestRejected(400, "chunk data longer than its size")
            self._state = "size"
        elif not line:  # trailer section ends with an empty line
            self.done = True


def _content_length(values: list[str]) -> int | None:
    if not values:
        return None
    parts = {p.strip() for v in values for p in v.split(",")}
    if len(parts) != 1:
        raise RequestRejected(400, "conflicting Content-Length values")
    text = parts.pop()
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        raise RequestRejected(400, "malformed Content-Length")
    return int(text)


def _is_chunked(values: list[str]) -> bool:
    codings = [c.strip().lower() for v in values for c in v.split(",") if c.strip()]
    if not codings:
        return False
    if codings != ["chunked"]:
        raise RequestRejected(501, f"unsupported Transfer-Encoding {', '.join(codings)[:40]!r}")
    return True


def request_framer(head: RequestHead) -> Framer:
    te = head.get("transfer-encoding")
    cl = head.get("content-length")
    if te and cl:
        raise RequestRejected(400, "both Transfer-Encoding and Content-Length; send one")
    if te:
        if head.version == "HTTP/1.0":
            raise RequestRejected(400, "Transfer-Encoding in an HTTP/1.0 request")
        _is_chunked(te)
        return Chunked()
    return Length(_content_length(cl) or 0)


def response_framer(head: ResponseHead, *, request_method: str) -> Framer:
    if request_method == "HEAD" or head.status < 200 or head.status in (204, 304):
        return Length(0)
    te = head.get("transfer-encoding")
    try:
        if te:
            codings = [c.strip().lower() for v in te for c in v.split(",") if c.strip()]
            return Chunked() if codings and codings[-1] == "chunked" else UntilClose()
        length = _content_length(head.get("content-length"))
    except RequestRejected as exc:
        raise RequestRejected(502, f"upstream framing: {exc.detail}") from exc
    return UntilClose() if length is None else Length(length)
