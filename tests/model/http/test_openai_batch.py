"""The batch API end to end with the OpenAI SDK: upload JSONL, create a batch, poll, download the output
file (one line per custom_id), on the same BatchService (and store) as gRPC; the SDK's ``files.list()`` and
``batches.list()`` in pages (``limit``, ``after``), each tenant seeing only its own, and the output file's
``bytes`` and ``expires_at``."""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.model.http.conftest import MODEL, base_url
from tests.support.server import RunningServer, free_port, start_server

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


def one_line_batch(client: openai.OpenAI, name: str) -> tuple[str, str]:
    """(input file id, batch id) of a batch of one short completion."""
    row = {"custom_id": name, "method": "POST", "url": "/v1/completions",
           "body": {"model": MODEL, "prompt": f"{name}:", "max_tokens": 2, "temperature": 0}}
    upload = client.files.create(file=(f"{name}.jsonl", jsonl([row])), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="1h")
    return upload.id, batch.id


def test_the_sdk_lists_files_and_batches_in_pages(client: openai.OpenAI, api_server: RunningServer) -> None:
    made = [one_line_batch(client, f"list{i}") for i in range(3)]
    files, batches = [f for f, _ in made][::-1], [b for _, b in made][::-1]  # newest first
    first = client.files.list(limit=2)
    assert [f.id for f in first.data] == files[:2] and first.has_more
    second = client.files.list(limit=2, after=files[1])
    assert second.data[0].id == files[2]
    everything = [f.id for f in client.files.list(limit=2)]  # the SDK follows has_more with after=<last id>
    assert everything[:3] == files and len(everything) == len(set(everything))
    assert [f.id for f in client.files.list(limit=10, purpose="batch").data][:3] == files
    assert client.files.list(purpose="batch_output").data == []  # output files are reached through their batch
    oldest_first = [f.id for f in client.files.list(order="asc")]
    assert oldest_first == everything[::-1]
    retention = api_server.server.config.batch_retention_hours * 3600
    listed = client.files.list(limit=1).data[0]
    assert listed.expires_at == listed.created_at + retention and listed.bytes > 0
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == batches[:2] and page.has_more
    assert client.batches.list(limit=2, after=batches[1]).data[0].id == batches[2]
    every_batch = [b.id for b in client.batches.list(limit=2)]
    assert every_batch[:3] == batches and len(every_batch) == len(set(every_batch))
    raw = client.get("/batches", cast_to=object, options={"params": {"limit": 1}})
    assert set(raw) == {"object", "data", "first_id", "last_id", "has_more"}  # type: ignore[arg-type]
    assert raw["first_id"] == raw["last_id"] == batches[0]  # type: ignore[index]
    for b in batches:
        wait_done(client, b)


@pytest.mark.parametrize(("path", "params", "param"), [
    ("/files", {"limit": 0}, "limit"), ("/files", {"limit": "ten"}, "limit"), ("/files", {"limit": 10001}, "limit"),
    ("/files", {"order": "sideways"}, "order"), ("/files", {"after": "file-nope"}, "after"),
    ("/batches", {"limit": 101}, "limit"), ("/batches", {"after": "batch_nope"}, "after"),
])
def test_bad_list_parameters_are_a_400_naming_them(client: openai.OpenAI, path: str, params: dict[str, object],
                                                   param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.get(path, cast_to=object, options={"params": params})
    assert info.value.body["param"] == param  # type: ignore[index]


def test_output_and_error_files_have_their_size_in_bytes(client: openai.OpenAI) -> None:
    rows = [{"custom_id": "ok", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL, "prompt": "One, two,", "max_tokens": 3, "temperature": 0}},
            {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
             "body": {"model": MODEL, "prompt": "x", "temperature": 9}}]
    upload = client.files.create(file=("sizes.jsonl", jsonl(rows)), purpose="batch")
    done = wait_done(client, client.batches.create(input_file_id=upload.id, endpoint="/v1/completions",
                                                   completion_window="1h").id)
    for file_id in (done.output_file_id, done.error_file_id):  # type: ignore[attr-defined]
        meta = client.files.retrieve(file_id)
        content = client.files.content(file_id).content
        assert isinstance(meta.bytes, int) and meta.bytes == len(content) > 0
        assert meta.purpose == "batch_output" and meta.expires_at is not None and meta.expires_at > meta.created_at


TENANTS = {"red": "tok-red-batch", "blue": "tok-blue-batch"}


@pytest.fixture(scope="module")
def tenant_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder: Path = tmp_path_factory.mktemp("batch-tenants")
    tenants = {name: {"token_sha256": [hashlib.sha256(tok.encode()).hexdigest()]} for name, tok in TENANTS.items()}
    (folder / "tenants.json").write_text(json.dumps({"tenants": tenants}))
    srv = start_server(http_port=free_port(), auth_tokens=str(folder / "tenants.json"))
    yield srv
    srv.close()


def test_each_tenant_lists_only_its_own_files_and_batches(tenant_server: RunningServer) -> None:
    def sdk(tenant: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=base_url(tenant_server), api_key=TENANTS[tenant], max_retries=0, timeout=60)

    with sdk("red") as red, sdk("blue") as blue:
        red_made = [one_line_batch(red, f"red{i}") for i in range(2)]
        blue_made = [one_line_batch(blue, "blue0")]
        assert [f.id for f in red.files.list()] == [f for f, _ in red_made][::-1]
        assert [f.id for f in blue.files.list()] == [blue_made[0][0]]
        assert [b.id for b in red.batches.list()] == [b for _, b in red_made][::-1]
        assert [b.id for b in blue.batches.list()] == [blue_made[0][1]]
        for path, theirs in (("/files", blue_made[0][0]), ("/batches", blue_made[0][1])):
            with pytest.raises(openai.BadRequestError) as info:  # another tenant's id is no cursor of red's
                red.get(path, cast_to=object, options={"params": {"after": theirs}})
            assert info.value.body["param"] == "after"  # type: ignore[index]
        for client, made in ((red, red_made), (blue, blue_made)):
            for _, batch_id in made:
                wait_done(client, batch_id)
