"""The batch API end to end with the OpenAI SDK: upload JSONL, create a batch, poll, download the output
file (one line per custom_id), on the same BatchService (and store) as gRPC."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.model.http.conftest import MODEL
from tests.support.server import RunningServer

pytestmark = pytest.mark.model


def jsonl(rows: list[dict[str, object]]) -> io.BytesIO:
    return io.BytesIO("\n".join(json.dumps(r) for r in rows).encode())


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 600) -> object:
    deadline = time.monotonic() + timeout
    while (b := client.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, f"batch still {b.status}"
        time.sleep(0.2)
    return b


def test_batch_of_chat_requests_end_to_end(client: openai.OpenAI, api_server: RunningServer) -> None:
    rows: list[dict[str, object]] = [
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "max_tokens": 6, "temperature": 0,
                  "messages": [{"role": "user", "content": f"Name fruit number {i}."}]}}
        for i in range(5)
    ]
    rows.append({"custom_id": "json", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "A point"}],
                          "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
                              "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"],
                              "additionalProperties": False}}}}})
    rows.append({"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "frequency_penalty": 3}})
    upload = client.files.create(file=("in.jsonl", jsonl(rows)), purpose="batch")
    assert upload.purpose == "batch" and upload.bytes > 0
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"suite": "http"})
    assert batch.endpoint == "/v1/chat/completions" and batch.input_file_id == upload.id
    assert batch.metadata == {"suite": "http"}
    done = wait_done(client, batch.id)
    assert done.status == "completed" and done.request_counts.total == 7
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 1)
    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in out) == ["json", "q0", "q1", "q2", "q3", "q4"]
    bodies = {r["custom_id"]: r["response"]["body"] for r in out}
    assert all(r["response"]["status_code"] == 200 for r in out)
    assert bodies["q0"]["object"] == "chat.completion" and bodies["q0"]["choices"][0]["message"]["content"]
    if bodies["json"]["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(bodies["json"]["choices"][0]["message"]["content"])["x"], int)
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert errors[0]["response"]["status_code"] == 400 and "frequency_penalty" in json.dumps(errors[0])
    assert api_server.server.batch.db.store.get_job("anonymous", batch.id).counts.completed == 6  # one store


def test_batch_of_completions_can_be_cancelled(client: openai.OpenAI) -> None:
    rows = [{"custom_id": f"c{i:03d}", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL, "prompt": f"Item {i}:", "max_tokens": 48, "ignore_eos": True}}
            for i in range(40)]
    upload = client.files.create(file=("c.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    done = wait_done(client, batch.id)
    assert done.status == "cancelled" and done.request_counts.total == 40
    lines = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id:
            lines += [json.loads(x) for x in client.files.content(file_id).text.splitlines()]
    ids = [x["custom_id"] for x in lines]
    assert len(ids) == len(set(ids)) <= 40  # at most one line per custom_id


def test_batch_api_refusals(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    assert info.value.body["param"] == "purpose"
    upload = client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as info:
        client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h")
    assert info.value.body["param"] == "endpoint"
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)
