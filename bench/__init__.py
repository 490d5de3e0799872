"""Speed and memory benchmarks for the netwarden proxy (`make bench`, `python -m bench.load`).

Modules:

- ``targets``          loopback servers the load client dials: echo, sink/source, keep-alive HTTP
- ``reference_proxy``  a deliberately naive StreamReader copy-loop proxy: a baseline row
- ``proxyproc``        starting a proxy subprocess, its ready line, its CPU time and RSS
- ``measure``          the measurements themselves (throughput, tunnel rate, HTTP rate, idle RSS)
- ``report``           the table and the JSON summary line
- ``load``             the command line that ties them together
"""
