"""Every example in README.md runs as written against a real server on the default model.

The examples are extracted from the README, so an edit there is tested here:

* each ```python block runs (in a fresh namespace) with ``localhost:50051`` replaced by the test
  server's address (``localhost:8000``, an OpenAI SDK example, by its HTTP API's); it must print
  something, and a ``doc`` it defines must validate against the ``schema`` it defines;
* each ```sh block that holds an ``inference-client`` or ``grpcurl`` command runs command by
  command, in order, in a temporary directory (files one command writes are there for the
  next), through bash, with ``inference-client`` on PATH (this interpreter's
  ``inference_client.cli``) and ``INFERENCE_TARGET`` set to the test server. Each command must
  exit 0; an ``inference-client`` command must print something, JSON output must parse, a
  document made with ``--schema FILE`` must validate against FILE and a batch result must carry
  no error;
* ``grpcurl``: Debian (bookworm) has no grpcurl package, so its commands are emulated the way
  grpcurl works: descriptors from the server's reflection service, the ``-d`` JSON parsed into
  the method's request type with protobuf's JSON mapping, the call made, the responses printed
  as JSON. A response must not be an ``error`` event, a streamed Generate must end with
  ``done``, and a GenerateJSON document must validate against the request's schema. When a
  ``grpcurl`` binary is on PATH, the real command runs as well.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import pytest
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from tests.support.server import RunningServer, free_port, start_server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ADDRESS = "localhost:50051"  # the address the README's examples use
HTTP_ADDRESS = "localhost:8000"  # ... and the OpenAI SDK examples (the HTTP API)
TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    lang: str
    line: int  # 1-based line of the opening fence
    text: str

    @property
    def id(self) -> str:
        return f"{self.lang}-line{self.line}"


def readme_blocks() -> list[Block]:
    """The fenced code blocks of README.md."""
    blocks: list[Block] = []
    lang, start, body = None, 0, []
    for n, line in enumerate(README.read_text(encoding="utf-8").splitlines(), 1):
        fence = re.match(r"^```(\w*)\s*$", line)
        if fence and lang is None:
            lang, start, body = fence.group(1), n, []
        elif line.startswith("```") and lang is not None:
            blocks.append(Block(lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    return blocks


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: lines joined while a quote is open or a line ends in ``\\``."""
    commands: list[str] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        commands.append(pending)
        pending = ""
    assert not pending, f"unterminated shell command: {pending!r}"
    return commands


def argv_of(command: str) -> list[str]:
    return shlex.split(command.replace("\\\n", " "), comments=True)


def is_example_block(block: Block) -> bool:
    if block.lang != "sh":
        return False
    return any(argv_of(c)[0] in ("inference-client", "grpcurl") for c in shell_commands(block.text))


PYTHON_BLOCKS = [b for b in readme_blocks() if b.lang == "python"]
SHELL_BLOCKS = [b for b in readme_blocks() if is_example_block(b)]


def test_readme_has_the_examples_this_file_runs() -> None:
    commands = [argv_of(c) for b in SHELL_BLOCKS for c in shell_commands(b.text)]
    assert len(PYTHON_BLOCKS) >= 2, "expected the Python client examples"
    assert sum(a[0] == "inference-client" for a in commands) >= 5, "expected the CLI examples"
    assert sum(a[0] == "grpcurl" for a in commands) >= 3, "expected the grpcurl examples"
    assert any(a[:2] == ["inference-client", "json"] for a in commands), "expected a JSON example"
    for block in readme_blocks():  # a mistyped fence would hide an example from this test
        assert block.lang in ("python", "sh", ""), f"README line {block.line}: fence language {block.lang!r}"


# --- python ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server() -> Iterator[RunningServer]:
    srv = start_server(http_port=free_port())
    yield srv
    srv.close()


@pytest.mark.model
@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda b: b.id)
def test_python_example(block: Block, request: pytest.FixtureRequest) -> None:
    if HTTP_ADDRESS in block.text:
        srv: RunningServer = request.getfixturevalue("http_server")
        code = block.text.replace(HTTP_ADDRESS, f"127.0.0.1:{srv.server.http_port}")
    else:
        assert ADDRESS in block.text, f"README line {block.line}: the example should use {ADDRESS}"
        code = block.text.replace(ADDRESS, request.getfixturevalue("server").target)
    namespace: dict[str, Any] = {"__name__": "__readme__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"README.md:{block.line}", "exec"), namespace)
    assert out.getvalue().strip(), f"README line {block.line}: the example printed nothing"
    if "doc" in namespace:
        assert "schema" in namespace, f"README line {block.line}: a doc without its schema"
        jsonschema.validate(namespace["doc"], namespace["schema"])


# --- sh: inference-client and grpcurl -------------------------------------------------------------


def client_shim(bin_dir: Path) -> dict[str, str]:
    """An ``inference-client`` on PATH that runs this interpreter's CLI; the environment to use."""
    bin_dir.mkdir()
    shim = bin_dir / "inference-client"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m inference_client.cli "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "clients" / "python"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    return env


def check_client_output(argv: list[str], stdout: str, cwd: Path, where: str) -> None:
    assert stdout.strip(), f"{where}: printed nothing"
    text = stdout.strip()
    if not text.startswith(("{", "[")):
        return
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:  # JSON lines (batch results)
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    for flag in ("--schema", "--json-schema"):
        if flag in argv:
            schema = json.loads((cwd / argv[argv.index(flag) + 1]).read_text())
            for doc in docs:
                jsonschema.validate(doc, schema)
    for doc in docs:
        if isinstance(doc, dict) and "error" in doc:
            assert doc["error"] is None, f"{where}: {doc['error']}"
            assert doc.get("text"), f"{where}: a result without text: {doc}"


class Grpcurl:
    """What ``grpcurl -plaintext [-d JSON] ADDRESS (list | describe SYMBOL | SERVICE/METHOD)`` does."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.db = ProtoReflectionDescriptorDatabase(self.channel)
        self.pool = DescriptorPool(self.db)

    def close(self) -> None:
        self.channel.close()

    def run(self, argv: list[str], where: str) -> str:
        data, rest, args = None, [], argv[1:]
        while args:
            arg = args.pop(0)
            if arg == "-plaintext":
                continue
            if arg == "-d":
                data = args.pop(0)
            elif arg.startswith("-"):
                raise AssertionError(f"{where}: grpcurl option {arg} is not emulated here")
            else:
                rest.append(arg)
        address, verb, *symbols = rest
        assert address == ADDRESS, f"{where}: the example should use {ADDRESS}"
        if verb == "list":
            services = list(self.db.get_services())
            assert "inference.v1.InferenceService" in services, services
            return "\n".join(services)
        if verb == "describe":
            (symbol,) = symbols
            service = self.pool.FindServiceByName(symbol)
            return "\n".join(m.full_name for m in service.methods)
        return self.call(verb, data or "{}", where)

    def call(self, path: str, data: str, where: str) -> str:
        service_name, method_name = path.split("/")
        methods = self.pool.FindServiceByName(service_name).methods_by_name
        assert method_name in methods, f"{where}: {service_name} has no method {method_name}"
        method = methods[method_name]
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        requests, decoder, text = [], json.JSONDecoder(), data.strip()
        while text:  # grpcurl reads one or more JSON messages
            obj, end = decoder.raw_decode(text)
            requests.append(json_format.ParseDict(obj, request_type()))
            text = text[end:].strip()
        kind = (
            ("stream" if method.client_streaming else "unary")
            + "_"
            + ("stream" if method.server_streaming else "unary")
        )
        rpc = getattr(self.channel, kind)(
            f"/{service_name}/{method_name}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_type.FromString,
        )
        request_arg: Any = iter(requests) if method.client_streaming else requests[0]
        result = rpc(request_arg, timeout=TIMEOUT_S)
        responses = list(result) if method.server_streaming else [result]
        assert responses, f"{where}: no response"
        for response in responses:
            if "error" in response.DESCRIPTOR.fields_by_name:
                assert not response.HasField("error"), f"{where}: {response}"
        if method_name == "Generate":
            assert responses[-1].HasField("done"), f"{where}: the stream did not end with done"
        if method_name == "GenerateJSON":
            jsonschema.validate(json.loads(responses[0].json), json.loads(requests[0].json_schema))
        return "\n".join(json_format.MessageToJson(r) for r in responses)


@pytest.mark.model
@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.id)
def test_shell_example(block: Block, server: Any, tmp_path: Path) -> None:
    env = client_shim(tmp_path / "bin")
    env["INFERENCE_TARGET"] = server.target
    cwd = tmp_path / "work"
    cwd.mkdir()
    grpcurl = Grpcurl(server.target)
    try:
        for command in shell_commands(block.text):
            argv = argv_of(command)
            where = f"README line {block.line}: {argv[0]} {' '.join(argv[1:3])}"
            if argv[0] == "grpcurl":
                assert grpcurl.run(argv, where).strip(), f"{where}: no output"
                if shutil.which("grpcurl") is None:
                    continue
                command = command.replace(ADDRESS, server.target)
            proc = subprocess.run(
                ["bash", "-c", f"set -eo pipefail\n{command}"],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
            assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
            if argv[0] in ("inference-client", "grpcurl"):
                check_client_output(argv, proc.stdout, cwd, where)
    finally:
        grpcurl.close()
