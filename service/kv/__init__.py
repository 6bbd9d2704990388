"""KV cache internals behind service.paged_kv: the KV records, the host tier of the prefix cache, the integrity audit."""
