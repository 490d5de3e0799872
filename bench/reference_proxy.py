"""A deliberately naive forward proxy: the baseline row of the benchmark table.

NOT a security component: no policy, no address guard, no real authentication
(any ``Proxy-Authorization`` is accepted and stripped). It exists to show what the
simplest asyncio proxy does on this machine, so netwarden's figures can be read
against it, and to validate the load client before the real proxy exists.

``python -m bench.reference_proxy [--listen 127.0.0.1:0]`` prints one JSON line when
ready, in the same shape as ``netwarden proxy``::

    {"type": "ready", "proxy_url": "http://bench:reference@127.0.0.1:PORT", "run_id": "reference"}

What it does per connection: read a request head with ``StreamReader.readuntil``;
``CONNECT host:port`` dials, answers 200 and copies both ways with two
``read(64 KiB)``/``write``/``drain`` loops (EOF propagated as half-close); an
absolute-URI request dials the origin, forwards the head in origin form, then copies
both ways the same way (so one client connection sticks to its first origin).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from typing import Final
from urllib.parse import urlsplit

__all__ = ["main", "serve"]

_COPY_CHUNK: Final = 64 * 1024
_MAX_HEAD: Final = 64 * 1024


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_COPY_CHUNK):
            writer.write(data)
            await writer.drain()
        if not writer.is_closing() and writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, RuntimeError):  # RuntimeError: uvloop, transport closed
        writer.close()


async def _relay(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_r: asyncio.StreamReader,
    upstream_w: asyncio.StreamWriter,
) -> None:
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(_copy(client_r, upstream_w))
        tasks.create_task(_copy(upstream_r, client_w))
    upstream_w.close()


def _split_head(head: bytes) -> tuple[str, str, list[bytes]]:
    lines = head.split(b"\r\n")
    method, target, _version = lines[0].decode("latin-1").split(" ", 2)
    headers = [line for line in lines[1:] if line]
    return method, target, headers


async def _handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
    try:
        head = await client_r.readuntil(b"\r\n\r\n")
        method, target, headers = _split_head(head)
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream_r, upstream_w = await asyncio.open_connection(host.strip("[]"), int(port))
            client_w.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                client_w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            upstream_r, upstream_w = await asyncio.open_connection(url.hostname, url.port or 80)
            kept = [h for h in headers if not h.lower().startswith(b"proxy-")]
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            request_line = f"{method} {path} HTTP/1.1".encode("latin-1")
            upstream_w.write(b"\r\n".join([request_line, *kept]) + b"\r\n\r\n")
        await _relay(client_r, client_w, upstream_r, upstream_w)
    except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
        with contextlib.suppress(OSError):
            reason = type(exc).__name__
            client_w.write(f"HTTP/1.1 502 {reason}\r\nContent-Length: 0\r\n\r\n".encode())
    finally:
        client_w.close()


async def serve(host: str, port: int) -> None:
    """Serve until SIGINT/SIGTERM, printing the ready line first."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(_handle, host, port, limit=_MAX_HEAD, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    url = f"http://bench:reference@{host}:{bound}"
    print(json.dumps({"type": "ready", "proxy_url": url, "run_id": "reference"}), flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.reference_proxy", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (default 127.0.0.1:0)")
    args = parser.parse_args(argv)
    host, _, port = str(args.listen).rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen {args.listen!r}: expected HOST:PORT, e.g. 127.0.0.1:0")
    try:
        import uvloop  # optional speed-up

        runner = uvloop.run
    except ImportError:
        runner = asyncio.run
    runner(serve(host, int(port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
