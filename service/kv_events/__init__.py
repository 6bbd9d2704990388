"""KV-cache events for prefix-aware routers, in vLLM's wire format over ZMQ (docs/scale-out.md).

``config`` holds the publisher's settings (built by ``service.assembly``), ``wire`` turns the prefix
index's records (``service.kv.events``) into vLLM's msgpack batches, ``publisher`` sends them from
its own thread (PUB socket, sequence numbers, a replay buffer behind a ROUTER socket) and counts
what it sends and drops, ``metrics`` shows those counts on ``/metrics``. Only this package imports
``zmq`` and ``msgpack``.
"""
