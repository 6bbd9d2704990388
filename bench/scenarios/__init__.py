"""The benchmark scenarios: one module per letter, each with ``run(cfg) -> dict`` and ``render(results) -> str``.

``run`` measures (starting and stopping its own servers) and returns what goes under ``results`` in
``bench/results/<name>.json``; ``render`` turns those results into the scenario's section of
``summary.md``. ``catalog`` lists them in the order the suite runs them. Scenarios share only
the harness (``bench.harness``), never each other's helpers.
"""
