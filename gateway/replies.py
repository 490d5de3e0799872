"""The proxy's own responses: status line, a few headers, a one-line plain-text body.

Refusals carry ``X-Netwarden-Reason: <code>`` so a client can tell a policy refusal from
an upstream failure; the body is the one line an agent can act on. Bodies never echo
header values or credentials back.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

__all__ = ["CONNECT_ESTABLISHED", "reply"]

CONNECT_ESTABLISHED: Final = b"HTTP/1.1 200 Connection Established\r\n\r\n"


def reply(
    status: int,
    body: str,
    *,
    code: str | None = None,
    close: bool = True,
    headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A complete HTTP/1.1 response with a text body (newline added)."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    payload = (body.replace("\r", " ").replace("\n", " ") + "\n").encode("utf-8", "replace")
    lines = [f"HTTP/1.1 {status} {phrase}", "Content-Type: text/plain; charset=utf-8"]
    lines.append(f"Content-Length: {len(payload)}")
    if code is not None:
        lines.append(f"X-Netwarden-Reason: {code}")
    lines.extend(f"{k}: {v}" for k, v in headers)
    lines.append("Connection: close" if close else "Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + payload
