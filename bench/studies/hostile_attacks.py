"""The attacks of ``bench.studies.hostile``: each runs in threads of its own until ``stop``.

Every attack is black-box: it speaks HTTP or gRPC to the server as an attacker would (no token
needed where none is configured). ``statuses`` collects the HTTP statuses (or gRPC code names)
its requests got, so the study can count 500s across the suite.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import httpx2
from inference.v1 import inference_pb2 as pb
from inference.v1 import inference_pb2_grpc as pb_grpc

MODEL = "SmolLM2-135M-Instruct.Q4_1"


class Attack:
    """Base: ``start`` launches ``_run`` in a thread; ``stop`` ends it and releases what it holds."""

    name = "attack"

    def __init__(self, http: str, grpc_target: str) -> None:
        self.http, self.grpc_target = http, grpc_target
        self.statuses: list[str] = []
        self.stopping = threading.Event()
        self.holding = threading.Event()  # set by an attack that holds connections once they are all open
        self._thread = threading.Thread(target=self._guarded, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def done(self) -> bool:
        """Its requests ended, or it holds what it opened."""
        return not self._thread.is_alive() or self.holding.is_set()

    def stop(self) -> None:
        self.stopping.set()
        self._thread.join(timeout=120)
        self.release()

    def _guarded(self) -> None:
        try:
            self._run()
        except Exception as exc:  # an attack's own failure is a figure, not a crash of the study
            self.statuses.append(f"client-error:{type(exc).__name__}")

    def _run(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        return None


class Posts(Attack):
    """``count`` requests of one body, one after another (``path`` on the HTTP API)."""

    def __init__(self, http: str, grpc_target: str, name: str, path: str, body: Callable[[], bytes],
                 count: int = 2) -> None:
        super().__init__(http, grpc_target)
        self.name, self.path, self.body, self.count = name, path, body, count

    def _run(self) -> None:
        data = self.body()
        with httpx2.Client(timeout=1200) as c:
            for _ in range(self.count):
                if self.stopping.is_set():
                    return
                r = c.post(self.http + self.path, content=data, headers={"content-type": "application/json"})
                self.statuses.append(str(r.status_code))


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 4, "messages": messages, **extra}).encode()


def many_messages(n: int = 20_000) -> bytes:
    roles = ("user", "assistant")
    return chat_body([{"role": roles[i % 2], "content": f"message number {i}"} for i in range(n)])


def special_token_flood(n: int = 80_000) -> bytes:
    return chat_body([{"role": "user", "content": "<|im_start|>" * n}])


def many_tools(n: int = 5_000) -> bytes:
    tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing",
                                                "parameters": {"type": "object", "properties": {}}}}
             for i in range(n)]
    return chat_body([{"role": "user", "content": "hi"}], tools=tools)


def plain_words(megabytes: int = 4) -> bytes:
    words = ("lorem ipsum dolor sit amet " * (megabytes * 40_000))[: megabytes << 20]
    return json.dumps({"model": MODEL, "max_tokens": 4, "prompt": words}).encode()


def huge_schema(kb: int = 1024) -> bytes:
    props = {f"field_{i}": {"type": "string", "description": "x" * 40} for i in range(kb * 1024 // 80)}
    fmt = {"type": "json_schema", "json_schema": {"name": "big", "schema": {"type": "object", "properties": props}}}
    return chat_body([{"role": "user", "content": "hi"}], response_format=fmt)


def bad_inputs() -> list[bytes]:
    """A lone surrogate in content, a 5,000-digit logit_bias key, a text/plain-looking body."""
    surrogate = b'{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud800"}]}' % MODEL.encode()
    bias = chat_body([{"role": "user", "content": "hi"}], logit_bias={"9" * 5000: 1})
    return [surrogate, bias]


class BadInputs(Attack):
    name = "bad_inputs"

    def _run(self) -> None:
        with httpx2.Client(timeout=120) as c:
            while not self.stopping.is_set():
                for data in bad_inputs():
                    r = c.post(self.http + "/v1/chat/completions", content=data,
                               headers={"content-type": "application/json"})
                    self.statuses.append(str(r.status_code))
                self.stopping.wait(0.2)


class Sockets(Attack):
    """Raw connections held open: ``slowloris`` drips a header byte a second, ``false_length`` sends
    a short body under a long Content-Length, ``flood`` leaves ``n`` requests half-sent."""

    def __init__(self, http: str, grpc_target: str, name: str, n: int) -> None:
        super().__init__(http, grpc_target)
        self.name, self.n = name, n
        self.socks: list[socket.socket] = []
        self.refused = 0

    def _connect(self) -> socket.socket | None:
        host, port = self.http.removeprefix("http://").split(":")
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            self.refused += 1
            return None
        self.socks.append(s)
        return s

    def _run(self) -> None:
        head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        for _ in range(self.n):
            if (s := self._connect()) is None:
                continue
            try:
                if self.name == "false_length":
                    s.sendall(head + b"content-type: application/json\r\ncontent-length: 100000\r\n\r\n{}")
                else:
                    s.sendall(head)
            except OSError:
                self.refused += 1
        self.holding.set()
        while self.name == "slowloris" and not self.stopping.wait(1.0):
            for s in list(self.socks):
                try:
                    s.send(b"x")
                except OSError:
                    self.socks.remove(s)
        self.stopping.wait()

    def closed_by_server(self) -> int:
        """How many held sockets the server has closed (a read returns EOF or an error)."""
        n = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                n += s.recv(65536) == b""
            except BlockingIOError:
                pass
            except OSError:
                n += 1
        return n

    def release(self) -> None:
        for s in self.socks:
            s.close()


class SseStall(Attack):
    """Streaming chats over raw sockets with a 4 KiB receive buffer that read the head, then nothing."""

    name = "sse_stall"

    def __init__(self, http: str, grpc_target: str, n: int = 4) -> None:
        super().__init__(http, grpc_target)
        self.n = n
        self.socks: list[socket.socket] = []

    def _run(self) -> None:
        host, port = self.http.removeprefix("http://").split(":")
        body = json.dumps({"model": MODEL, "max_tokens": 1500, "ignore_eos": True, "stream": True,
                           "messages": [{"role": "user", "content": "Tell me a long story."}]}).encode()
        for _ in range(self.n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                      b"content-length: %d\r\n\r\n%s" % (len(body), body))
            self.statuses.append(s.recv(64).split(b" ")[1].decode())
            self.socks.append(s)
        self.holding.set()
        self.stopping.wait()

    def release(self) -> None:
        for s in self.socks:
            s.close()


class GrpcStall(Attack):
    """``n`` gRPC Generate streams that read their first event, then stop reading."""

    name = "grpc_stall"
    id_prefix = "stall"

    def __init__(self, http: str, grpc_target: str, n: int = 16) -> None:
        super().__init__(http, grpc_target)
        self.n = n
        self.channel = grpc.insecure_channel(grpc_target)
        self.calls: list[Any] = []

    def _run(self) -> None:
        stub = pb_grpc.InferenceServiceStub(self.channel)
        for i in range(self.n):
            req = pb.GenerateRequest(request_id=f"{self.id_prefix}-{i}", prompt="Tell me a long story.",
                                     sampling=pb.SamplingParams(max_tokens=1500, ignore_eos=True))
            call = stub.Generate(iter([req]))
            next(call)
            self.calls.append(call)
            self.statuses.append("OK")
            self._opened(call)
        self.holding.set()
        self.stopping.wait()

    def _opened(self, call: Any) -> None:
        """A call has read its first event: it reads no more."""

    def release(self) -> None:
        for call in self.calls:
            call.cancel()
        self.channel.close()


class GrpcReaders(GrpcStall):
    """The control of ``grpc_stall``: the same 16 streams, read to their end (their cost as honest load)."""

    name = "grpc_readers_control"
    id_prefix = "read"

    def _opened(self, call: Any) -> None:
        threading.Thread(target=self._drain, args=(call,), daemon=True).start()

    @staticmethod
    def _drain(call: Any) -> None:
        try:
            for _ in call:
                pass
        except grpc.RpcError:  # cancelled by ``release``
            pass


def catalogue(http: str, grpc_target: str) -> list[Callable[[], Attack]]:
    """Every attack of the study, in the order it runs them."""
    chat = "/v1/chat/completions"
    return [
        lambda: Posts(http, grpc_target, "chat_20000_messages", chat, many_messages),
        lambda: Posts(http, grpc_target, "special_token_flood", chat, special_token_flood),
        lambda: Posts(http, grpc_target, "tools_5000", chat, many_tools),
        lambda: Posts(http, grpc_target, "plain_words_4mb", "/v1/completions", plain_words),
        lambda: Posts(http, grpc_target, "schema_1mb", chat, huge_schema, count=4),
        lambda: BadInputs(http, grpc_target),
        lambda: Sockets(http, grpc_target, "slowloris", 400),
        lambda: Sockets(http, grpc_target, "false_length", 50),
        lambda: Sockets(http, grpc_target, "half_sent_flood", 3000),
        lambda: SseStall(http, grpc_target),
        lambda: GrpcStall(http, grpc_target),
        lambda: GrpcReaders(http, grpc_target),  # not an attack: the same load, read
    ]


def wait_until(cond: Callable[[], bool], timeout_s: float) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.25)
    return cond()
