"""Speed and memory benchmarks for the netwarden proxy (`make bench`, `python -m bench.load`).

Modules:

- ``targets``          loopback servers the load client dials: echo, sink/source, keep-alive HTTP
- ``reference_proxy``  a deliberately naive StreamReader copy-loop proxy: a baseline row
- ``proxyproc``        starting a proxy subprocess, its ready line, its CPU time and RSS
- ``route``            direct or through a proxy; what a working tunnel answers; CPU used
- ``throughput``       relay throughput on blocking sockets (1 and 16 tunnels)
- ``measure``          tunnel setup rate, idle-tunnel RSS, keep-alive HTTP rate (event loop)
- ``profile``          py-spy sampling of the proxy per phase, and a summary of the samples
- ``report``           the table and the JSON summary line
- ``load``             the command line that ties them together
"""
