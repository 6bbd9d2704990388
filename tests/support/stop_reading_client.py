"""A real client process that reads part of its Generate stream and then stops reading.

``python -m tests.support.stop_reading_client TARGET REQUESTS MAX_TOKENS READ_FIRST``: sends REQUESTS
greedy requests on one stream with the Python client library (which acknowledges what it reads),
reads READ_FIRST events, prints ``stopped <n>`` and stops reading until a line arrives on stdin; then
it reads to the end and prints one JSON line: the number of events read and each request's final
event (``kind``, ``status``, ``message``, ``completion_tokens``).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from inference_client import Delta, Done, ErrorEvent, InferenceClient, RequestSpec


def final(event: Any) -> dict[str, Any]:
    if isinstance(event, Done):
        return {"kind": "done", "completion_tokens": event.usage.completion_tokens}
    assert isinstance(event, ErrorEvent)
    return {"kind": "error", "status": event.error.status, "message": event.error.message}


def main(target: str, requests: int, max_tokens: int, read_first: int) -> None:
    specs = [
        RequestSpec(prompt=f"Count to a thousand, part {i}:", max_tokens=max_tokens, ignore_eos=True, temperature=0)
        for i in range(requests)
    ]
    with InferenceClient(target, timeout=600) as client:
        stream = client.generate_many(specs)
        read, finals = 0, {}
        for rid, event in stream:
            read += 1
            if not isinstance(event, Delta):
                finals[rid] = final(event)
            if read == read_first:
                print(f"stopped {read}", flush=True)
                sys.stdin.readline()  # not reading the stream meanwhile
        print(json.dumps({"read": read, "finals": finals}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
