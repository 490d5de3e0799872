"""Sans-IO parsing of what a proxy client and an upstream send: request and response heads.

Pure functions of bytes; no sockets. Grammar (RFC 9112):

    request-line  = method SP request-target SP HTTP-version   (CRLF; a bare LF is accepted, §2.2)
    CONNECT       target is authority-form  ``host:port`` (``[v6]:port``), port required
    other methods target is absolute-form   ``http://host[:port][/path][?query]``
    header-line   = field-name ":" OWS field-value OWS          (obs-fold refused, §5.2)

Everything else is refused with ``RequestRejected`` carrying the status to answer:
400 (malformed, origin-form, userinfo, https:// target, conflicting framing), 405
(TRACE: never forwarded), 431 (head over the size limit or too many fields), 505
(HTTP/0.9 or a version other than 1.0/1.1), 501 (a transfer coding we do not speak).
That is the only exception these functions raise, whatever the input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, NamedTuple

from policy.errors import GatewayError

__all__ = [
    "MAX_HEAD_BYTES",
    "Headers",
    "RequestHead",
    "RequestRejected",
    "ResponseHead",
    "find_head_end",
    "parse_request_head",
    "parse_response_head",
]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_FIELDS: Final = 256

Headers = tuple[tuple[str, str], ...]

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(rb"HTTP/(\d)\.(\d)")
_FIELD_VALUE_BAD = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_PORT = re.compile(r"[0-9]{1,5}")
_STATUS = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?: (.*))?")
_TARGET_BAD = re.compile(rb"[\x00-\x20\x7f-\xff]")


class RequestRejected(GatewayError):
    """A head we refuse; ``status`` is the HTTP status to answer, ``detail`` the one-line why."""

    def __init__(self, status: int, detail: str) -> None:
        self.status = status
        self.detail = detail
        super().__init__(f"{status}: {detail}")


class RequestHead(NamedTuple):
    """A parsed request head (immutable).

    ``host`` is the destination as written (brackets kept for IPv6; the policy
    canonicalises it) and ``port`` its port. For a forward request ``path`` is the
    origin-form target to send upstream; for CONNECT it is "".

    A NamedTuple rather than a frozen dataclass: one is built per request on the hot
    path, and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field)
    cost 3 µs of the 10 µs a CONNECT head took to parse.
    """

    method: str
    target: str
    version: str
    headers: Headers
    host: str
    port: int
    path: str
    size: int

    @property
    def is_connect(self) -> bool:
        return self.method == "CONNECT"

    def get(self, name: str) -> list[str]:
        return _get(self.headers, name)


@dataclass(frozen=True, slots=True)
class ResponseHead:
    status: int
    reason: str
    version: str
    headers: Headers
    size: int

    def get(self, name: str) -> list[str]:
        return _get(self.headers, name)


def _get(headers: Headers, name: str) -> list[str]:
    lname = name.lower()
    return [v for k, v in headers if k.lower() == lname]


def find_head_end(buf: bytes | bytearray, *, max_size: int = MAX_HEAD_BYTES) -> int | None:
    """Index just past the blank line ending the head in ``buf``, or None if not there yet.

    Raises 431 once ``max_size`` bytes hold no complete head, and checks the request
    line as soon as it is complete so garbage is refused without waiting for a blank
    line that may never come.
    """
    end = _head_end(buf, max_size)
    if end is not None:
        return end
    if len(buf) >= max_size:
        raise RequestRejected(431, f"request head is over {max_size // 1024} KiB")
    newline = buf.find(b"\n", 0, 8192)
    if newline >= 0:
        _parse_request_line(bytes(buf[:newline]).rstrip(b"\r"))
    elif len(buf) >= 8192:
        raise RequestRejected(414, "request line is over 8 KiB")
    return None


def _head_end(buf: bytes | bytearray, max_size: int) -> int | None:
    limit = min(len(buf), max_size + 4)
    crlf = buf.find(b"\r\n\r\n", 0, limit)
    lf = buf.find(b"\n\n", 0, limit)
    candidates = [i + 4 for i in (crlf,) if i >= 0] + [i + 2 for i in (lf,) if i >= 0]
    if not candidates:
        return None
    end = min(candidates)
    if end > max_size:
        raise RequestRejected(431, f"request head is over {max_size // 1024} KiB")
    return end


def _lines(head: bytes) -> list[bytes]:
    # Fast path: CR and LF only ever as CRLF pairs (what every client sends).
    crlf = head.count(b"\r\n")
    if crlf > 2 and head.count(b"\r") == crlf == head.count(b"\n") and head.endswith(b"\r\n\r\n"):
        return head[:-4].split(b"\r\n")
    lines = head.split(b"\n")
    # The head ends with a blank line: drop it and the empty string after the final LF.
    while lines and lines[-1] in (b"", b"\r"):
        lines.pop()
    out = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    for line in out:
        if b"\r" in line:
            raise RequestRejected(400, "bare CR in the request head")
    return out


def _parse_request_line(line: bytes) -> tuple[str, bytes, str]:
    parts = line.split(b" ")
    if len(parts) == 2 and _TOKEN.fullmatch(parts[0]):
        raise RequestRejected(505, "HTTP/0.9 is not supported; send an HTTP/1.1 request")
    if len(parts) != 3:
        raise RequestRejected(400, "malformed request line; expected 'METHOD TARGET HTTP/1.1'")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise RequestRejected(400, "malformed request method")
    vm = _VERSION.fullmatch(version)
    if vm is None:
        if version.startswith(b"HTTP/"):
            raise RequestRejected(505, "unsupported HTTP version; use HTTP/1.1")
        raise RequestRejected(400, "malformed request line; expected 'METHOD TARGET HTTP/1.1'")
    if vm.group(1) != b"1" or vm.group(2) not in (b"0", b"1"):
        raise RequestRejected(505, "unsupported HTTP version; use HTTP/1.1")
    if not target or _TARGET_BAD.search(target):
        raise RequestRejected(400, "malformed request target")
    return method.decode("ascii"), target, version.decode("ascii")


def _parse_fields(lines: list[bytes]) -> Headers:
    if len(lines) > MAX_FIELDS:
        raise RequestRejected(431, f"more than {MAX_FIELDS} header fields")
    out: list[tuple[str, str]] = []
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            raise RequestRejected(400, "obsolete header line folding is not accepted")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise RequestRejected(400, "malformed header field")
        value = value.strip(b" \t")
        if _FIELD_VALUE_BAD.search(value):
            raise RequestRejected(400, "control character in a header value")
        out.append((name.decode("ascii"), value.decode("latin-1")))
    return tuple(out)


def _split_authority(authority: str, *, default_port: int | None) -> tuple[str, int]:
    if "@" in authority:
        raise RequestRejected(400, "credentials in the request target are not accepted")
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise RequestRejected(400, "unclosed '[' in the target host")
        host, rest = authority[: close + 1], authority[close + 1 :]
        if rest and not rest.startswith(":"):
            raise RequestRejected(400, "malformed target authority")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_raw = authority.rpartition(":")
        if not colon:
            host, port_text = authority, None
        else:
            port_text = port_text_raw
            if ":" in host:
                raise RequestRejected(400, "an IPv6 target must be in brackets: [2001:db8::1]:443")
    if not host or host == "[]":
        raise RequestRejected(400, "the target has no host")
    if port_text is None or port_text == "":
        if default_port is None:
            raise RequestRejected(400, "CONNECT needs host:port, e.g. CONNECT example.com:443")
        return host, default_port
    if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
        raise RequestRejected(400, f"invalid port {port_text[:16]!r}; ports are 1-65535")
    return host, int(port_text)


def _parse_target(method: str, target: bytes) -> tuple[str, int, str]:
    text = target.decode("ascii")
    if method == "CONNECT":
        host, port = _split_authority(text, default_port=None)
        return host, port, ""
    if text.startswith("/") or text == "*":
        raise RequestRejected(
            400,
            "this is a proxy: send the full URL (GET http://host/path) or use CONNECT host:port",
        )
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise RequestRejected(400, "malformed request target; expected http://host/path")
    scheme = scheme.lower()
    if scheme == "https":
        raise RequestRejected(400, "for https:// use CONNECT host:443 (set HTTPS_PROXY)")
    if scheme != "http":
        raise RequestRejected(400, f"unsupported scheme {scheme[:16]!r}; only http:// is forwarded")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=-1)
    authority, path = (rest, "/") if cut < 0 else (rest[:cut], rest[cut:])
    path = path.split("#", 1)[0]
    if path.startswith("?"):
        path = "/" + path
    host, port = _split_authority(authority, default_port=80)
    return host, port, path or "/"


def parse_request_head(data: bytes | bytearray) -> RequestHead:
    """Parse a complete request head (``data`` ends with the blank line)."""
    raw = bytes(data)
    lines = _lines(raw)
    if not lines:
        raise RequestRejected(400, "empty request")
    method, target, version = _parse_request_line(lines[0])
    if method == "TRACE":
        raise RequestRejected(405, "TRACE is not forwarded by this proxy")
    headers = _parse_fields(lines[1:])
    host, port, path = _parse_target(method, target)
    return RequestHead(
        method=method,
        target=target.decode("ascii"),
        version=version,
        headers=headers,
        host=host,
        port=port,
        path=path,
        size=len(raw),
    )


def parse_response_head(data: bytes | bytearray) -> ResponseHead:
    """Parse a complete upstream response head; a bad one is a 502 to pass on."""
    raw = bytes(data)
    try:
        lines = _lines(raw)
        if not lines:
            raise RequestRejected(502, "empty response from upstream")
        match = _STATUS.fullmatch(lines[0])
        if match is None:
            raise RequestRejected(502, "malformed status line from upstream")
        headers = _parse_fields(lines[1:])
    except RequestRejected as exc:
        raise RequestRejected(502, f"upstream sent a bad response head: {exc.detail}") from exc
    status = int(match.group(1))
    reason = (match.group(2) or b"").decode("latin-1")
    version = lines[0][:8].decode("ascii")
    return ResponseHead(
        status=status, reason=reason, version=version, headers=headers, size=len(raw)
    )
