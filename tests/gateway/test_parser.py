"""The sans-IO request/response head parser and body framing: tables + fuzz."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.framing import Chunked, Length, UntilClose, request_framer, response_framer
from gateway.parser import (
    RequestRejected,
    find_head_end,
    parse_request_head,
    parse_response_head,
)

settings.register_profile("fast", max_examples=300, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=20_000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("NETWARDEN_FUZZ", "fast"))


@pytest.mark.parametrize(
    ("raw", "method", "host", "port", "path"),
    [
        pytest.param(
            b"CONNECT api.x.com:443 HTTP/1.1\r\n\r\n", "CONNECT", "api.x.com", 443, "", id="connect"
        ),
        pytest.param(
            b"CONNECT [::1]:8443 HTTP/1.1\r\nHost: x\r\n\r\n",
            "CONNECT",
            "[::1]",
            8443,
            "",
            id="connect-v6",
        ),
        pytest.param(
            b"GET http://x.com/a?b=1 HTTP/1.1\r\n\r\n",
            "GET",
            "x.com",
            80,
            "/a?b=1",
            id="absolute-form",
        ),
        pytest.param(
            b"POST HTTP://X.com:8080 HTTP/1.0\n\n", "POST", "X.com", 8080, "/", id="bare-lf-no-path"
        ),
        pytest.param(
            b"GET http://x.com?q HTTP/1.1\r\n\r\n", "GET", "x.com", 80, "/?q", id="query-no-path"
        ),
        pytest.param(
            b"GET http://[2001:db8::1]:81/p#frag HTTP/1.1\r\n\r\n",
            "GET",
            "[2001:db8::1]",
            81,
            "/p",
            id="v6-fragment-dropped",
        ),
    ],
)
def test_parses(raw: bytes, method: str, host: str, port: int, path: str) -> None:
    assert find_head_end(raw) == len(raw)
    head = parse_request_head(raw)
    assert (head.method, head.host, head.port, head.path) == (method, host, port, path)


@pytest.mark.parametrize(
    ("raw", "status", "match"),
    [
        pytest.param(b"GET /\r\n\r\n", 505, "HTTP/0.9", id="http09"),
        pytest.param(b"GET http://x/ HTTP/2.0\r\n\r\n", 505, "version", id="http2"),
        pytest.param(b"GET / HTTP/1.1\r\n\r\n", 400, "this is a proxy", id="origin-form"),
        pytest.param(b"GET https://x/ HTTP/1.1\r\n\r\n", 400, "CONNECT", id="https-target"),
        pytest.param(b"GET ftp://x/ HTTP/1.1\r\n\r\n", 400, "scheme", id="ftp"),
        pytest.param(b"GET http://u:p@x/ HTTP/1.1\r\n\r\n", 400, "credentials", id="userinfo"),
        pytest.param(b"CONNECT x.com HTTP/1.1\r\n\r\n", 400, "host:port", id="connect-no-port"),
        pytest.param(b"CONNECT x.com:0 HTTP/1.1\r\n\r\n", 400, "1-65535", id="port-0"),
        pytest.param(b"CONNECT x.com:65536 HTTP/1.1\r\n\r\n", 400, "1-65535", id="port-big"),
        pytest.param(b"CONNECT ::1:443 HTTP/1.1\r\n\r\n", 400, "brackets", id="v6-unbracketed"),
        pytest.param(b"CONNECT :443 HTTP/1.1\r\n\r\n", 400, "no host", id="empty-host"),
        pytest.param(b"TRACE http://x/ HTTP/1.1\r\n\r\n", 405, "TRACE", id="trace"),
        pytest.param(b"G(T http://x/ HTTP/1.1\r\n\r\n", 400, "method", id="bad-method"),
        pytest.param(b"GET http://x/ HTTP/1.1\r\n folded\r\n\r\n", 400, "folding", id="obs-fold"),
        pytest.param(b"GET http://x/ HTTP/1.1\r\nA b: c\r\n\r\n", 400, "header", id="bad-name"),
        pytest.param(b"GET http://x/ HTTP/1.1\r\nA: b\x00c\r\n\r\n", 400, "control", id="nul"),
        pytest.param(b"GET http://x/ HTTP/1.1\r\nA: b\rc\r\n\r\n", 400, "CR", id="bare-cr"),
        pytest.param(b"\x16\x03\x01\x02\x00\x01\r\n\r\n", 400, "request line", id="tls-hello"),
    ],
)
def test_rejects(raw: bytes, status: int, match: str) -> None:
    with pytest.raises(RequestRejected, match=match) as info:
        _parse_all(raw)
    assert info.value.status == status


def _parse_all(raw: bytes) -> None:
    end = find_head_end(raw)
    if end is not None:
        request_framer(parse_request_head(raw[:end]))


def _status(call: Callable[[], object]) -> int | None:
    """The status of the RequestRejected ``call`` raised, None if it returned; anything
    else escapes and fails the test."""
    try:
        call()
    except RequestRejected as exc:
        return exc.status
    return None


def test_partial_head_waits() -> None:
    assert find_head_end(b"CONNECT a.com:443 HTTP/1.1\r\nHost: a") is None


def test_garbage_line_is_refused_before_the_blank_line() -> None:
    with pytest.raises(RequestRejected) as info:
        find_head_end(b"hello there friend how are you\r\n")
    assert info.value.status == 400


def test_oversized_head_is_431() -> None:
    raw = b"GET http://x/ HTTP/1.1\r\n" + b"X-Big: " + b"a" * (70 * 1024)
    with pytest.raises(RequestRejected) as info:
        find_head_end(raw)
    assert info.value.status == 431


def test_too_many_fields_is_431() -> None:
    raw = b"GET http://x/ HTTP/1.1\r\n" + b"A: b\r\n" * 300 + b"\r\n"
    with pytest.raises(RequestRejected) as info:
        parse_request_head(raw)
    assert info.value.status == 431


@given(st.binary(max_size=2048))
def test_fuzz_only_our_error_escapes(data: bytes) -> None:
    status = _status(lambda: _parse_all(data))
    assert status is None or 400 <= status < 600


_LINE = st.sampled_from(
    [b"CONNECT a.b:443 HTTP/1.1", b"GET http://a/ HTTP/1.1", b"POST http://[::1]:8/x HTTP/1.0"]
)
_FIELD = st.tuples(st.from_regex(rb"\A[A-Za-z\-]{1,12}\Z"), st.binary(max_size=40)).map(
    lambda kv: kv[0] + b": " + kv[1]
)


@given(_LINE, st.lists(_FIELD, max_size=12), st.binary(max_size=64))
def test_fuzz_structured_heads(line: bytes, fields: list[bytes], tail: bytes) -> None:
    raw = line + b"\r\n" + b"\r\n".join(fields) + (b"\r\n" if fields else b"") + b"\r\n" + tail
    assert find_head_end(raw) is not None
    assert _status(lambda: _parse_all(raw)) in (None, 400, 431, 501)


@given(st.binary(max_size=1024))
def test_fuzz_response_heads_and_chunked(data: bytes) -> None:
    assert _status(lambda: parse_response_head(data)) in (None, 502)
    framer = Chunked()
    taken: list[int] = []
    assert _status(lambda: taken.append(framer.feed(data))) in (None, 400)
    assert all(0 <= t <= len(data) for t in taken)


def _heads(extra: bytes) -> bytes:
    return b"POST http://x/ HTTP/1.1\r\n" + extra + b"\r\n"


@pytest.mark.parametrize(
    ("extra", "kind"),
    [
        pytest.param(b"", Length, id="no-body"),
        pytest.param(b"Content-Length: 5\r\n", Length, id="length"),
        pytest.param(b"Content-Length: 5, 5\r\n", Length, id="same-twice"),
        pytest.param(b"Transfer-Encoding: chunked\r\n", Chunked, id="chunked"),
    ],
)
def test_request_framer(extra: bytes, kind: type) -> None:
    assert isinstance(request_framer(parse_request_head(_heads(extra))), kind)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        pytest.param(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400, id="te-and-cl"),
        pytest.param(b"Content-Length: 5\r\nContent-Length: 6\r\n", 400, id="differing-cl"),
        pytest.param(b"Content-Length: -1\r\n", 400, id="negative-cl"),
        pytest.param(b"Transfer-Encoding: gzip, chunked\r\n", 501, id="gzip-te"),
    ],
)
def test_request_framer_refuses_smuggling(extra: bytes, status: int) -> None:
    with pytest.raises(RequestRejected) as info:
        request_framer(parse_request_head(_heads(extra)))
    assert info.value.status == status


def test_chunked_finds_the_end_across_splits() -> None:
    body = b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\nNEXT"
    for cut in range(len(body)):
        framer = Chunked()
        taken = framer.feed(body[:cut])
        taken += framer.feed(body[taken:]) if not framer.done else 0
        assert framer.done
        assert body[taken:] == b"NEXT"


def test_response_framer_kinds() -> None:
    ok = parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n")
    assert isinstance(response_framer(ok, request_method="GET"), Length)
    assert response_framer(ok, request_method="HEAD").done
    bare = parse_response_head(b"HTTP/1.0 200 OK\r\n\r\n")
    assert isinstance(response_framer(bare, request_method="GET"), UntilClose)
    nc = parse_response_head(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n")
    assert response_framer(nc, request_method="GET").done
