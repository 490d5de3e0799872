"""Gateway test fixtures; their code lives in gw_support (importable by the tests too)."""

from tests.gateway.gw_support import ca, echo, http_origin, https_origin, make_proxy

__all__ = ["ca", "echo", "http_origin", "https_origin", "make_proxy"]
