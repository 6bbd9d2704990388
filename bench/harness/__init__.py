"""The benchmark harness: what every scenario uses and none owns.

``config`` (paths, the results folder, ``BenchConfig``), ``results`` (machine info, result
files), ``stats`` (percentiles, ratios, intervals), ``tables`` (markdown cells and tables),
``procs`` (server subprocesses), ``prompts`` (seeded prompts of exact token lengths), the load
generators ``grpc_load``, ``openai_load`` and ``mixed_load``, ``batch_jobs`` (BatchService calls),
``secure`` (TLS and token clients), and ``engine_ceiling`` (the raw decode loop, run as a subprocess).
"""
