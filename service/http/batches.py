"""The batch API the OpenAI SDK uses, mapped onto the BatchService (its store, worker and tenants).

* ``POST /v1/files`` (multipart: ``file``, ``purpose=batch``) stores a JSONL input file;
  ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``;
  ``GET /v1/files`` lists the uploaded files (``limit``, ``after``, ``order``, ``purpose``);
* ``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window``,
  ``metadata``) validates every line as the live endpoint would and creates a durable job
  (``BatchJobs.create``); ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``;
  ``GET /v1/batches`` lists the jobs, newest first (``limit``, ``after``);
* the job's output and error files are ``file-out-<batch id>`` and ``file-err-<batch id>``,
  generated from the stored results once the job has ended (one line per custom_id); their
  ``bytes`` are counted by generating them, their ``expires_at`` is the job's deletion time.
  They are reached through their batch, not listed (``GET /v1/files`` lists uploads).

A listing is OpenAI's list object (``service.http.listing``); ``after`` must name one of the
caller's own files or jobs (else a 400 naming ``after``).

Everything is per tenant: another tenant's file or batch is a 404. Uploading a
file and creating a batch are new work (``Need.WORK``: refused 503 while the
server loads, drains or has failed); reading, deleting and cancelling are
answered whatever the engine's state (``Need.STORE``), as the gRPC BatchService does.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Protocol

from inference.v1 import batch_pb2 as bpb
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from service.api.readiness import Need
from service.http.app import HttpApi
from service.http.batch_lines import (
    ENDPOINTS,
    KEY_ENDPOINT,
    KEY_INPUT,
    TERMINAL,
    batch_object,
    output_line,
    parse_lines,
)
from service.http.body import Body, parse_json
from service.http.errors import ApiError, bad_param
from service.http.files import FileStore, Page
from service.http.listing import list_object, list_query
from service.request.errors import BadRequest

WINDOW = re.compile(r"^([1-9][0-9]{0,2})h$")
MAX_USER_METADATA = 14  # the job keeps 16 entries; two hold the endpoint and the input file
MAX_FILES_PAGE = 10_000  # OpenAI's limits: files 1..10,000 (default all of them), batches 1..100 (default 20)
DEFAULT_BATCHES_PAGE, MAX_BATCHES_PAGE = 20, 100


class BatchJobs(Protocol):
    """The batch service's operations for the caller's tenant (``service.batch.jobs.BatchJobs``)."""

    async def create(self, options: bpb.BatchOptions, lines: Iterable[bpb.BatchItem | tuple[str, str]]) -> bpb.Batch: ...
    async def get(self, batch_id: str) -> bpb.Batch | None: ...
    async def list(self, limit: int, after: str = "") -> tuple[list[bpb.Batch], bool]: ...
    async def cancel(self, batch_id: str) -> bpb.Batch | None: ...
    def results(self, batch_id: str) -> AsyncIterator[bpb.GetBatchResultsResponse]: ...


def _not_found(what: str, ident: str) -> ApiError:
    return ApiError(404, f"No such {what}: {ident!r}", code=f"{what}_not_found")


class BatchRoutes:
    """Files and batches routes over one ``HttpApi`` (auth, readiness, body limits)."""

    def __init__(self, api: HttpApi, jobs: BatchJobs, files: FileStore) -> None:
        self.api, self.jobs, self.files = api, jobs, files

    async def upload(self, request: Request) -> Response:
        tenant = self.api.admit(request, Need.WORK)  # NOTE: the first step of new work: a draining replica refuses it
        data = await self.api.body(request, self.api.config.max_file_bytes)

        async def replay() -> AsyncGenerator[bytes, None]:
            yield data

        try:
            form = await MultiPartParser(request.headers, replay(), max_files=1, max_fields=8).parse()
        except (MultiPartException, ValueError) as exc:
            raise ApiError(400, f"expected a multipart/form-data body with file and purpose: {exc}") from None
        upload, purpose = form.get("file"), form.get("purpose")
        if purpose != "batch":
            raise bad_param("purpose", "purpose must be 'batch' (the only file purpose this server keeps)")
        if not isinstance(upload, UploadFile):
            raise bad_param("file", "a 'file' part is required")
        record = await self.files.put(tenant, upload.filename or "upload.jsonl", "batch", await upload.read())
        return JSONResponse(record.to_json())

    async def _output(self, file_id: str) -> tuple[bpb.Batch, bool] | None:
        """The batch of an output (False) or error (True) file id, once the batch has ended."""
        for prefix, errors in (("file-out-", False), ("file-err-", True)):
            if file_id.startswith(prefix):
                batch = await self.jobs.get(file_id.removeprefix(prefix))
                if batch is not None and batch.state in TERMINAL:
                    return batch, errors
        return None

    async def _lines(self, batch: bpb.Batch, errors: bool) -> AsyncIterator[bytes]:
        """The lines of a batch's output (``errors``: error) file."""
        async for r in self.jobs.results(batch.id):
            failed, line = output_line(r, batch, self.api.config.model_name)
            if failed == errors:
                yield line

    async def file(self, request: Request) -> Response:
        tenant, file_id = self.api.admit(request, Need.STORE), request.path_params["file_id"]
        if (record := await self.files.get(tenant, file_id)) is not None:
            return JSONResponse(record.to_json())
        if (out := await self._output(file_id)) is not None:
            batch, errors = out
            # NOTE: an output file exists only as the job's results: its size is that of the lines it
            # would send now (one pass over the results, as a download)
            size = sum([len(line) async for line in self._lines(batch, errors)])
            expires = batch.delete_at.seconds if batch.HasField("delete_at") else None
            return JSONResponse({"id": file_id, "object": "file", "bytes": size, "created_at": batch.created_at.seconds,
                                 "filename": f"{file_id}.jsonl", "purpose": "batch_output", "status": "processed",
                                 "expires_at": expires})
        raise _not_found("file", file_id)

    async def list_files(self, request: Request) -> Response:
        tenant = self.api.admit(request, Need.STORE)
        q = list_query(request.query_params, MAX_FILES_PAGE, MAX_FILES_PAGE, order=True)
        try:
            records, more = await self.files.list(tenant, Page(q.limit, q.after, request.query_params.get("purpose"),
                                                               q.ascending))
        except LookupError:
            raise bad_param("after", f"after must be the id of one of your files; no file {q.after!r}") from None
        return JSONResponse(list_object([r.to_json() for r in records], more))

    async def content(self, request: Request) -> Response:
        tenant, file_id = self.api.admit(request, Need.STORE), request.path_params["file_id"]
        if (data := await self.files.content(tenant, file_id)) is not None:
            return Response(data, media_type="application/jsonl")
        if (out := await self._output(file_id)) is None:
            raise _not_found("file", file_id)
        return StreamingResponse(self._lines(*out), media_type="application/jsonl")

    async def delete_file(self, request: Request) -> Response:
        tenant, file_id = self.api.admit(request, Need.STORE), request.path_params["file_id"]
        if not await self.files.delete(tenant, file_id):
            raise _not_found("file", file_id)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    def _options(self, body: Body, endpoint: str, file_id: str) -> bpb.BatchOptions:
        window = WINDOW.match(body.str_("completion_window", required=True) or "")
        if window is None or int(window[1]) > 720:
            raise bad_param("completion_window", "completion_window must be '<hours>h', at most 720h (e.g. '24h')")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise bad_param("metadata", "metadata must be an object of strings")
        if len(meta) > MAX_USER_METADATA or any(k.startswith("openai.") for k in meta):
            raise bad_param("metadata", f"at most {MAX_USER_METADATA} metadata entries, none starting 'openai.'")
        meta = {**meta, KEY_ENDPOINT: endpoint, KEY_INPUT: file_id}
        return bpb.BatchOptions(completion_window_s=int(window[1]) * 3600, metadata=meta)

    async def create(self, request: Request) -> Response:
        tenant = self.api.admit(request, Need.WORK)
        body = Body(parse_json(await self.api.json_body(request, self.api.config.max_body_bytes)),
                    ("input_file_id", "endpoint", "completion_window", "metadata", "output_expires_after"))
        endpoint, file_id = body.str_("endpoint", required=True), body.str_("input_file_id", required=True)
        if endpoint not in ENDPOINTS:
            raise bad_param("endpoint", f"endpoint must be one of {', '.join(ENDPOINTS)}")
        assert file_id is not None
        options = self._options(body, endpoint, file_id)
        data = await self.files.content(tenant, file_id)
        if data is None:
            raise _not_found("file", file_id)
        try:
            config = self.api.config
            lines = await self.api.intake.offload(parse_lines, data, endpoint, config.model_name, config.limits)
            batch = await self.jobs.create(options, lines)
        except BadRequest as exc:
            raise ApiError(400, str(exc)) from None
        return JSONResponse(batch_object(batch))

    async def get(self, request: Request) -> Response:
        self.api.admit(request, Need.STORE)
        batch_id = request.path_params["batch_id"]
        if (batch := await self.jobs.get(batch_id)) is None:
            raise _not_found("batch", batch_id)
        return JSONResponse(batch_object(batch))

    async def list_batches(self, request: Request) -> Response:
        self.api.admit(request, Need.STORE)
        q = list_query(request.query_params, DEFAULT_BATCHES_PAGE, MAX_BATCHES_PAGE)
        try:
            batches, more = await self.jobs.list(q.limit, q.after)
        except LookupError:
            raise bad_param("after", f"after must be the id of one of your batches; no batch {q.after!r}") from None
        return JSONResponse(list_object([batch_object(b) for b in batches], more))

    async def cancel(self, request: Request) -> Response:
        self.api.admit(request, Need.STORE)
        batch_id = request.path_params["batch_id"]
        if (batch := await self.jobs.cancel(batch_id)) is None:
            raise _not_found("batch", batch_id)
        return JSONResponse(batch_object(batch))

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files", self.list_files, methods=["GET"]),
            Route("/v1/files/{file_id}", self.file, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete_file, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.list_batches, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.get, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]
