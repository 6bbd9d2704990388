"""A gRPC client over a raw socket, speaking just enough HTTP/2 to start one call and then not read.

Unlike a grpc library client (whose transport keeps reading the socket into its
HTTP/2 window whatever the application does), this client stops reading the
socket itself: what the server writes piles up in the two kernels' buffers.
It grants the largest HTTP/2 windows there are, so the only flow control left
is TCP's. ``h2`` is not a dependency, so the few frames are built here (HPACK
literals without Huffman coding or indexing, RFC 7541 6.2.2).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

from inference.v1 import inference_pb2 as pb

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
WINDOW_UPDATE = 0x8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
MAX_WINDOW = 2**31 - 1
STREAM = 1


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    assert len(name) < 127 and len(value) < 127
    return b"\x00" + bytes([len(name)]) + name + bytes([len(value)]) + value


def request_headers(path: str, authority: str) -> bytes:
    """HPACK block: :method POST and :scheme http indexed (static entries 3 and 6), the rest literal."""
    return b"\x83\x86" + b"".join(_literal(n, v) for n, v in (
        (b":path", path.encode()), (b":authority", authority.encode()),
        (b"content-type", b"application/grpc"), (b"te", b"trailers"),
    ))


class RawGrpcCall:
    """One ``Generate`` call on its own connection; ``SO_RCVBUF`` is set before connecting."""

    def __init__(self, host: str, port: int, request: pb.GenerateRequest, rcvbuf: int = 4096) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((host, port))
        self.buffer = b""
        message = request.SerializeToString()
        self.sock.sendall(
            PREFACE
            + frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, MAX_WINDOW))  # SETTINGS_INITIAL_WINDOW_SIZE
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))  # the connection's window too
            + frame(HEADERS, END_HEADERS, STREAM,
                    request_headers("/inference.v1.InferenceService/Generate", f"{host}:{port}"))
            + frame(DATA, END_STREAM, STREAM, b"\x00" + struct.pack(">I", len(message)) + message)
        )

    def _frames(self) -> Iterator[tuple[int, int, int, bytes]]:
        """Frames as they arrive (kind, flags, stream, payload); SETTINGS and PINGs are acknowledged."""
        while True:
            while len(self.buffer) < 9 or len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                self.buffer += chunk
            size = int.from_bytes(self.buffer[:3], "big")
            kind, flags = self.buffer[3], self.buffer[4]
            stream = struct.unpack(">I", self.buffer[5:9])[0] & MAX_WINDOW
            payload, self.buffer = self.buffer[9:9 + size], self.buffer[9 + size:]
            if kind == SETTINGS and not flags & ACK:
                self.sock.sendall(frame(SETTINGS, ACK, 0, b""))
            elif kind == PING and not flags & ACK:
                self.sock.sendall(frame(PING, ACK, 0, payload))
            yield kind, flags, stream, payload

    def responses(self) -> Iterator[pb.GenerateResponse]:
        """The call's response messages, read from the socket, until the stream ends (trailers, reset)."""
        data = b""
        for kind, flags, stream, payload in self._frames():
            if stream != STREAM:
                if kind == GOAWAY:
                    return
                continue
            if kind == DATA:
                data += payload
                while len(data) >= 5 and len(data) >= 5 + struct.unpack(">I", data[1:5])[0]:
                    size = struct.unpack(">I", data[1:5])[0]
                    yield pb.GenerateResponse.FromString(data[5:5 + size])
                    data = data[5 + size:]
            if kind == RST_STREAM or flags & END_STREAM:
                return

    def close(self) -> None:
        self.sock.close()
