"""A stand-in for NCCL's RAS listener on 127.0.0.1 (the real one needs a GPU job).

It speaks the line protocol of NVIDIA/nccl src/ras/client_support.cc: ``CLIENT PROTOCOL N``
gets ``SERVER PROTOCOL 2``, ``SET FORMAT json`` gets ``OK``, ``VERBOSE STATUS`` gets the
answer, then the connection closes. The answers it gives are NCCL's recorded ones
(tests/fixtures/nccl). ``mode`` makes it misbehave:

- "answer": the protocol, then ``answer``;
- "hang": accepts and never says a word;
- "stall": answers the handshake, never the status;
- "garbage": sends ``answer`` (or junk) at once and closes;
- "no-json": refuses ``SET FORMAT json`` like an NCCL without JSON output.
"""

from __future__ import annotations

import socket
import threading


class FakeRas:
    def __init__(self, answer: str = "", mode: str = "answer") -> None:
        self.answer = answer
        self.mode = mode
        self.commands: list[str] = []
        self._stop = threading.Event()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.05)
        self.address = ("127.0.0.1", self._sock.getsockname()[1])
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def addr(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "hang":
                self._stop.wait()
                return
            if self.mode == "garbage":
                conn.sendall((self.answer or "\x00\xffHTTP/1.1 400 Bad Request\r\n\r\n").encode())
                return
            conn.settimeout(5)
            try:
                with conn.makefile("rb") as lines:
                    for raw in lines:
                        if self._reply(conn, raw.decode().strip()):
                            return
            except OSError:
                return  # the client gave up (its timeout): nothing to answer

    def _reply(self, conn: socket.socket, line: str) -> bool:
        """Answer one command line; True when the answer is complete (the connection closes)."""
        self.commands.append(line)
        command = line.upper()
        if command.startswith("CLIENT PROTOCOL "):
            conn.sendall(b"SERVER PROTOCOL 2\n")
        elif command == "SET FORMAT JSON":
            conn.sendall(b"ERROR: Invalid format json\n" if self.mode == "no-json" else b"OK\n")
        elif command in ("STATUS", "VERBOSE STATUS"):
            if self.mode == "stall":
                self._stop.wait()
            else:
                conn.sendall(self.answer.encode())
            return True
        else:
            conn.sendall(f"ERROR: Unknown command {line}\n".encode())
        return False
