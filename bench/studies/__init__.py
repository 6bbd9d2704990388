"""One-off studies: scripts that answered one question with the scenarios' code (not part of ``make bench``).

Each runs as ``python -m bench.studies.<name>`` under ``flock /tmp/bench.lock`` and writes its own
result file (see its docstring).
"""
