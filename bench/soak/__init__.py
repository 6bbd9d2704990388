"""The soak benchmark (``make soak``, ``python -m bench.soak``): ``run`` drives one server with the
mixed load of ``load`` for minutes and samples its memory; ``report`` prints the outcome."""
