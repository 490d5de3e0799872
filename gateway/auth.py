"""Per-run proxy credentials: the run's token as a Basic password (any user) or a Bearer.

Compared with ``hmac.compare_digest`` so timing says nothing about the token. The token
never leaves this module in a message, a repr or an event.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from typing import Final

__all__ = ["PROXY_USER", "is_authorized", "new_token"]

PROXY_USER: Final = "netwarden"


def new_token() -> str:
    """A fresh random run token (URL-safe, so it can sit in a proxy URL unquoted)."""
    return secrets.token_urlsafe(24)


def is_authorized(header_values: list[str], token: str) -> bool:
    """Whether any ``Proxy-Authorization`` value carries ``token``."""
    expected = token.encode()
    ok = False
    for value in header_values:
        scheme, _, credentials = value.strip().partition(" ")
        credentials = credentials.strip()
        candidate: bytes | None = None
        if scheme.lower() == "basic":
            try:
                decoded = base64.b64decode(credentials, validate=True)
            except (binascii.Error, ValueError):
                continue
            _, colon, password = decoded.partition(b":")
            candidate = password if colon else None
        elif scheme.lower() == "bearer":
            candidate = credentials.encode("latin-1", "replace")
        # compare every candidate (no early exit on a match either)
        if candidate is not None and hmac.compare_digest(candidate, expected):
            ok = True
    return ok
