"""The model process's side of its channel to the run's supervisor (sandbox/isolation/supervisor.py).

The model's code runs in the worker process; the run's result channel to npuport stays with the
supervisor, which the worker cannot reach. The worker talks to the supervisor over a socket of its own:
length-prefixed JSON frames. Everything it sends is the model process's claim; the supervisor adds what
it measured itself (the clock, who sent each frame, the processes of the run).

Protocol (worker -> supervisor, supervisor replies where noted):
- ``hello`` before anything else runs in the worker (before ``site``, so before any ``.pth`` of a layered
  env): the supervisor notes the process's identity and replies ``ack``;
- ``ready`` once the model is built and its inputs made (the supervisor's load time ends);
- ``begin`` {label} -> ``go``; ``end`` {label, ...claims}: one timed call, timed by the supervisor from
  its ``go`` to the ``end`` it receives;
- ``result`` {result}: the model process's result (its claims), once.

Standard library only: it runs in any layered environment, before ``site`` is set up.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterator
from typing import Any

WORKER_FD_ENV = "SANDBOX_WORKER_FD"
HEADER = struct.Struct("!I")
MAX_FRAME = 16 * 1024 * 1024


class ChannelClosed(ConnectionError):
    pass


def send_frame(sock: socket.socket, obj: Any) -> None:
    data = json.dumps(obj, default=str).encode()
    sock.sendall(HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ChannelClosed("the supervisor closed the channel")
        buf += chunk
    return bytes(buf)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if size > MAX_FRAME:
        raise ChannelClosed(f"frame of {size} bytes")
    obj = json.loads(_recv_exact(sock, size))
    if not isinstance(obj, dict):
        raise ChannelClosed("not an object")
    return obj


class WorkerChannel:
    """The worker's end: hello/ack at start, ``timed`` sections around each measured call, one result."""

    def __init__(self, fd: int) -> None:
        self.sock = socket.socket(fileno=fd)
        self.sock.set_inheritable(False)  # the model's subprocesses do not get it (a copy would be seen anyway)
        self.sections = 0

    def hello(self) -> None:
        send_frame(self.sock, {"t": "hello", "pid": os.getpid()})
        reply = recv_frame(self.sock)
        if reply.get("t") != "ack":
            raise ChannelClosed(f"unexpected reply {reply.get('t')!r}")

    def ready(self) -> None:
        send_frame(self.sock, {"t": "ready"})

    @contextlib.contextmanager
    def timed(self, label: str, claims: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """One call timed by the supervisor: its clock runs from its ``go`` to our ``end``. What the body puts
        in the yielded dict travels with ``end`` (the model process's claims about that call)."""
        send_frame(self.sock, {"t": "begin", "label": label})
        reply = recv_frame(self.sock)
        if reply.get("t") != "go":
            raise ChannelClosed(f"unexpected reply {reply.get('t')!r}")
        extra: dict[str, Any] = dict(claims or {})
        try:
            yield extra
        finally:
            send_frame(self.sock, {"t": "end", "label": label, **extra})
            self.sections += 1

    def result(self, result: dict[str, Any]) -> None:
        send_frame(self.sock, {"t": "result", "result": result})
        self.sock.close()


_current: WorkerChannel | None = None


def connect() -> WorkerChannel | None:
    """The channel the supervisor passed (its fd number in SANDBOX_WORKER_FD), greeted; None when this
    process was not started by a supervisor (run by hand)."""
    global _current
    fd = os.environ.pop(WORKER_FD_ENV, None)
    if fd is None:
        return None
    _current = WorkerChannel(int(fd))
    _current.hello()
    return _current


def current() -> WorkerChannel | None:
    """The channel greeted at start (by the worker's boot), if any."""
    return _current


def ready() -> None:
    """Tell the supervisor the model is built (its load time ends); nothing when run by hand."""
    if _current is not None:
        _current.ready()


@contextlib.contextmanager
def timed(label: str, claims: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """``current().timed`` when a supervisor runs this process, else a plain block."""
    chan = _current
    if chan is None:
        yield dict(claims or {})
        return
    with chan.timed(label, claims) as extra:
        yield extra


# The worker's first code (``python -I -S -c BOOT ROOT MODULE ARGS...``): greet the supervisor before
# ``site`` runs any .pth of the environment, then set up site as a normal start would and run MODULE.
BOOT = """
import sys
root, module = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
from sandbox.isolation import worker_channel
worker_channel.connect()
sys.path.remove(root)
import site
site.main()
sys.argv = [module, *sys.argv[3:]]
import runpy
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


# an empty worker: what a supervised run costs beyond its model (bench/supervisor_overhead.py)
if __name__ == "__main__":
    from sandbox.isolation import (
        worker_channel as _wc,  # the module the boot greeted with (this file runs as __main__)
    )

    _chan = _wc.current() or _wc.connect()
    _wc.ready()
    with _wc.timed("run"):
        pass
    if _chan is not None:
        _chan.result({"ok": True})
