"""The ``bargein`` command and what it runs besides the services: the call client, the demos, the
timeline they print, and the benchmarks."""
