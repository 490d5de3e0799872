"""``make run``: one real command in a real sandbox, against a local upstream.

It shows the three things netwarden is for, then prints the run's audit lines:

1. an allowed fetch through the proxy (the upstream answers);
2. a refused fetch (``example.com`` is not on the demo allowlist: 403 and a
   ``network_blocked`` event);
3. a direct bypass — busybox ``wget -Y off`` ignores the proxy variables and dials the
   upstream's port on the host directly — which fails, because the sandbox's network
   reaches nothing but the proxy port.

Where no docker engine can run, the command runs on the host instead (a
``sandbox_skipped`` event and a warning say so) and the bypass is NOT blocked: the demo
says that rather than failing. Exit 0 when every step behaved as it should.
"""

from __future__ import annotations

import io
import json
import re
import shlex
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

from gateway.audit import read_events
from gateway.run import RunRequest, SandboxMode, new_run_id, run_sync
from policy import Mode, policy_from_rules
from policy.errors import GatewayError
from sandbox.runtime import connect

__all__ = ["main"]

_BODY = b"hello from the demo upstream\n"
# The upstream listens on every host address: the proxy reaches it on 127.0.0.2 (the
# host's loopback), and the bypass attempt aims at the host's address on the sandbox
# bridge, where an unconfined container WOULD reach it.
_LOOPBACK = "127.0.0.2"


class _Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(_BODY)))
        self.end_headers()
        self.wfile.write(_BODY)

    def log_message(self, format: str, *args: object) -> None:  # stdlib names it "format"
        return


class _Tee(io.RawIOBase):
    def __init__(self, target: BinaryIO) -> None:
        self.target = target
        self.seen = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]  # bytes is all we get
        self.seen += data
        self.target.write(data)
        return len(data)

    def flush(self) -> None:
        self.target.flush()


def _script(port: int, in_docker: bool) -> list[str]:
    direct = f"host.docker.internal:{port}" if in_docker else f"{_LOOPBACK}:{port}"
    if in_docker:
        fetch, bypass = "wget -q -O- {url} 2>&1", "timeout 5 wget -Y off -q -O- {url} 2>&1"
    else:  # the host may lack busybox; Python's urllib honours the proxy variables too
        client = (
            "import sys, urllib.request as u\n"
            "o = u.build_opener() if sys.argv[2] == 'proxy' else u.build_opener(u.ProxyHandler({}))\n"
            "try: sys.stdout.write(o.open(sys.argv[1], timeout=5).read().decode())\n"
            "except Exception as e: sys.exit(f'urllib: {e}')\n"
        )
        py = f"{shlex.quote(sys.executable)} -c {shlex.quote(client)}"
        fetch, bypass = py + " {url} proxy 2>&1", py + " {url} direct 2>&1"
    steps = [
        ("allowed", "through the proxy, an allowed destination", fetch, f"{_LOOPBACK}:{port}"),
        ("refused", "through the proxy, a destination the policy refuses", fetch, "example.com"),
        ("bypass", "a direct connection that ignores the proxy", bypass, direct),
    ]
    lines = []
    for name, what, template, target in steps:
        url = f"http://{target}/"
        lines.append(f'echo "== {name}: {what}: {url}"')
        lines.append(template.replace("{url}", url) + f'; echo "[{name} exit $?]"')
    return ["sh", "-c", "\n".join(lines)]


def main() -> int:
    upstream = ThreadingHTTPServer(("0.0.0.0", 0), _Upstream)  # see _LOOPBACK's comment
    port = upstream.server_address[1]
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        in_docker = True
        try:
            connect(timeout=5)
        except GatewayError as exc:
            in_docker = False
            print(f"demo: no docker engine ({exc}); running on the host instead")
        # The address guard refuses loopback and private addresses unless an IP rule names
        # them explicitly. The demo upstream lives on this host's loopback, so the policy
        # allows exactly that address and port, and nothing else.
        policy = policy_from_rules([f"{_LOOPBACK}:{port}"], mode=Mode.ALLOWLIST, name="demo")
        with tempfile.TemporaryDirectory(prefix="netwarden-demo-") as tmp:
            events = Path(tmp) / "events.jsonl"
            tee = _Tee(sys.stdout.buffer)
            request = RunRequest(
                argv=tuple(_script(port, in_docker)),
                policy=policy,
                run_id=new_run_id(),
                sandbox=SandboxMode.AUTO,
                events=events,
            )
            print(f"demo: upstream on port {port}; policy allows only {_LOOPBACK}:{port}")
            sys.stdout.flush()
            code = run_sync(request, stdout=tee)  # type: ignore[arg-type]  # a BinaryIO duck
            print(f"\ndemo: the command exited {code}. Audit log ({events}):")
            lines = list(read_events(events))
            for record in lines:
                print(json.dumps(record))
        return _verdict(tee.seen.decode(errors="replace"), lines, in_docker)
    finally:
        upstream.shutdown()


def _data(event: dict[str, object]) -> dict[str, object]:
    data = event.get("data")
    return data if isinstance(data, dict) else {}


def _verdict(output: str, events: list[dict[str, object]], in_docker: bool) -> int:
    exits = {m.group(1): int(m.group(2)) for m in re.finditer(r"\[(\w+) exit (\d+)\]", output)}
    types = [e.get("type") for e in events]
    checks = {
        "allowed fetch got the upstream's answer": exits.get("allowed") == 0
        and _BODY.decode().strip() in output,
        "refused fetch got 403 and a network_blocked event": exits.get("refused", 0) != 0
        and "403" in output
        and "network_blocked" in types,
    }
    if in_docker:
        checks["direct bypass failed"] = exits.get("bypass", 0) != 0
        checks["sandbox_started with egress enforced"] = any(
            e.get("type") == "sandbox_started" and _data(e).get("egress") == "enforced"
            for e in events
        )
    else:
        checks["sandbox_skipped event (no engine: the bypass is NOT confined)"] = (
            "sandbox_skipped" in types
        )
    print()
    for what, ok in checks.items():
        print(f"demo: [{'ok' if ok else 'FAILED'}] {what}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
