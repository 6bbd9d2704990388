"""Reports over the result files: ``summary`` writes summary.md (each scenario renders its own
section), ``plots`` draws the PNG charts (drawings in ``charts`` and ``fairness_chart``)."""
