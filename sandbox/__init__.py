"""Container lifecycle on the docker SDK: the only package that imports docker.

``Sandbox`` (lifecycle) runs one confined container per run; ``SandboxSpec`` (spec) says
what it is made of; ``reap_orphans`` (reaper) cleans up after dead runs; ``run_checks``
(doctor) says whether this machine can confine sandboxes at all. The proxy is reached
through the ``ProxyStarter`` Protocol: this package never imports ``gateway``.
"""

from .image import DEFAULT_IMAGE
from .lifecycle import PROXY_HOSTNAME, Egress, ProxyEndpoint, ProxyStarter, Sandbox, proxy_env
from .names import RUN_ID_PATTERN, run_key
from .spec import Mount, NetworkMode, SandboxSpec, check_spec_safety, load_spec

__all__ = [
    "DEFAULT_IMAGE",
    "PROXY_HOSTNAME",
    "RUN_ID_PATTERN",
    "Egress",
    "Mount",
    "NetworkMode",
    "ProxyEndpoint",
    "ProxyStarter",
    "Sandbox",
    "SandboxSpec",
    "check_spec_safety",
    "load_spec",
    "proxy_env",
    "run_key",
]
