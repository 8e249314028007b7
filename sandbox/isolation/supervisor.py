"""The trusted supervisor of a sandbox run: the one process of the run that holds the result channel.

The model's code runs in a worker process the supervisor starts (sandbox/isolation/worker_channel.py); the worker
never has the result channel: the supervisor's fds are not inherited (``close_fds``), and the supervisor
makes itself non-dumpable (``PR_SET_DUMPABLE`` 0), so /proc/<pid>/fd, /mem and /environ of it are closed
to the worker, which has no capability to override that (bwrap: uid 65534, ``--cap-drop ALL``; ptrace,
process_vm_* and pidfd_getfd are refused by the seccomp filter). The supervisor runs npuport's own
interpreter (``python -I -S``, standard library and this package only, sandbox/isolation/supervised.py starts it):
no ``.pth`` of a layered env (nor of ours), no model module is ever imported here.

What it measures itself, and the parent trusts: the clock (load: start to ``ready``; each timed call:
its ``go`` to the worker's ``end``; total), who sent each frame (SO_PASSCRED: the kernel's pid of the
sender, so a copy of the harness the model started, a fork of it, cannot speak for the run), whether the
worker process is still the program it started as (an ``exec`` into a copy of itself changes its memory
layout: ``/proc/<pid>/stat``'s stack, argument and heap addresses), and the processes the run started
(a child subreaper; a process that loaded torch besides the worker ran model computation outside the
process the target was installed in). What the worker sends (tokens, op statistics, profile, dtypes) is
the model process's claim, passed on as such.

Argument: one JSON object ``{"worker": [argv...], "max_bytes": N, "watch": true}``. Output: one JSON
object on the fd named by HARNESS_RESULT_FD: ``{"supervisor": {...measured...}, "claims": {...}|null}``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

from sandbox.isolation.worker_channel import HEADER, WORKER_FD_ENV, send_frame

RESULT_FD_ENV = "HARNESS_RESULT_FD"
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
WATCH_S = 0.1
EXIT_GRACE_S = 2.0  # a worker that sent no result: time to exit on its own
AFTER_RESULT_S = 0.3  # one that did
MAX_SECTIONS = 100_000
MAX_WATCHED = 4096
_CREDS = struct.Struct("3i")  # struct ucred: pid, uid, gid
# /proc/<pid>/stat fields (1-based) that an exec replaces: start_code, end_code, start_stack, start_data,
# end_data, start_brk, arg_start, arg_end, env_start, env_end (shown to a reader allowed to ptrace-read it).
_IDENTITY_FIELDS = (26, 27, 28, 45, 46, 47, 48, 49, 50, 51)


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def identity(pid: int) -> tuple[str, ...] | None:
    """The memory layout addresses of ``pid`` that an exec changes, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()  # after "pid (comm) ": field 3 is fields[0]
    try:
        found = tuple(fields[i - 3] for i in _IDENTITY_FIELDS)
    except IndexError:
        return None
    return None if all(f == "0" for f in found) else found  # zeros: not ours to read


def _ppid_and_start(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2:].split()
    return (int(fields[1]), fields[19]) if len(fields) > 19 else None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read(2000).replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _loaded_torch(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            return b"libtorch" in fh.read(8 << 20)
    except OSError:
        return False


class ProcessWatch:
    """Processes of the run other than the worker: descendants of the supervisor (it is their subreaper,
    so orphans of the worker's tree stay findable) seen at each look, and whether one loaded torch."""

    def __init__(self, supervisor: int) -> None:
        self.supervisor = supervisor
        self.worker = -1
        self.seen: dict[tuple[int, str], dict[str, Any]] = {}

    def look(self) -> None:
        for pid in self._descendants():
            if pid == self.worker:
                continue
            info = _ppid_and_start(pid)
            if info is None:
                continue
            start = info[1]
            rec = self.seen.get((pid, start))
            if rec is None:
                rec = self.seen[(pid, start)] = {"pid": pid, "argv": _cmdline(pid)[:300], "torch": False}
            if not rec["torch"] and _loaded_torch(pid):
                # Seen with torch at two looks: a child between fork and exec (a subprocess the model's
                # libraries start) shows its parent's mappings for an instant, and is not a computation.
                rec["looks"] = rec.get("looks", 0) + 1
                rec["torch"] = rec["looks"] >= 2

    def _descendants(self) -> list[int]:
        """The supervisor's descendants, by each thread's ``children`` list (a walk of the run's tree, not of
        every process of the host), else by a scan of /proc and parent links."""
        if not os.path.exists(f"/proc/{self.supervisor}/task/{self.supervisor}/children"):
            return self._scan()
        found: list[int] = []
        todo = [self.supervisor]
        while todo and len(found) < MAX_WATCHED:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                        kids = [int(k) for k in fh.read().split()]
                        found += kids
                        todo += kids
        return found

    def _scan(self) -> list[int]:
        table: dict[int, int] = {}
        with contextlib.suppress(OSError):
            for name in os.listdir("/proc"):
                if name.isdigit() and (info := _ppid_and_start(int(name))) is not None:
                    table[int(name)] = info[0]
        out = []
        for pid in table:
            up = pid
            for _ in range(64):
                up = table.get(up, 0)
                if up == self.supervisor:
                    out.append(pid)
                    break
                if up <= 1:
                    break
        return out

    def report(self) -> list[dict[str, Any]]:
        return list(self.seen.values())[:50]


class Supervisor:
    def __init__(self, worker_argv: list[str], max_bytes: int, watch: bool) -> None:
        self.worker_argv = worker_argv
        self.max_bytes = max_bytes
        self.watch = ProcessWatch(os.getpid()) if watch else None
        self.findings: list[dict[str, str]] = []
        self.sections: list[dict[str, Any]] = []
        self.claims: dict[str, Any] | None = None
        self.load_s: float | None = None
        self.received = 0
        self._open: dict[str, Any] | None = None
        self._identity: tuple[str, ...] | None = None
        self._hello = False
        self._buf = bytearray()

    def finding(self, kind: str, detail: str) -> None:
        if len(self.findings) < 50:
            self.findings.append({"kind": kind, "detail": detail[:500]})

    def run(self) -> dict[str, Any]:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        env = {k: v for k, v in os.environ.items() if k != RESULT_FD_ENV}
        env[WORKER_FD_ENV] = str(theirs.fileno())
        start = time.monotonic()
        proc = subprocess.Popen(self.worker_argv, env=env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                close_fds=True)
        theirs.close()
        if self.watch is not None:
            self.watch.worker = proc.pid
        try:
            self._serve(ours, proc, start)
        finally:
            ours.close()
            rc = self._finish(proc)
        total = time.monotonic() - start
        if self.watch is not None:
            self.watch.look()
            torch_procs = [p for p in self.watch.report() if p["torch"]]
            for p in torch_procs:
                self.finding("torch-process", f"the model started another process that loaded torch (pid {p['pid']}: "
                                              f"{p['argv'][:200]}); what it computed ran outside the process the "
                                              "target was installed in")
        return {
            "supervisor": {
                "load_s": self.load_s, "total_s": total, "sections": self.sections, "worker_exit": rc,
                "findings": self.findings, "processes": self.watch.report() if self.watch else [],
                "received_bytes": self.received,
            },
            "claims": self.claims,
        }

    def _serve(self, sock: socket.socket, proc: subprocess.Popen[bytes], start: float) -> None:
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        next_look = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if self.watch is not None and now >= next_look:
                    self.watch.look()
                    next_look = now + WATCH_S
                if not sel.select(timeout=WATCH_S):
                    if proc.poll() is not None and not self._readable(sock):
                        return
                    continue
                if not self._read(sock, proc.pid):
                    return
                while (frame := self._next_frame()) is not None:
                    if not self._handle(frame, sock, proc.pid, start):
                        return
        finally:
            sel.close()

    @staticmethod
    def _readable(sock: socket.socket) -> bool:
        with contextlib.suppress(BlockingIOError, OSError):
            return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        return False

    def _read(self, sock: socket.socket, worker: int) -> bool:
        try:
            data, anc, _flags, _addr = sock.recvmsg(1 << 16, socket.CMSG_SPACE(_CREDS.size))
        except OSError as exc:
            self.finding("protocol", f"reading the worker's channel failed: {exc}")
            return False
        if not data:
            return False
        sender = None
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= _CREDS.size:
                sender = _CREDS.unpack(payload[:_CREDS.size])[0]
        if sender != worker:
            self.finding("foreign-reporter", f"process {sender} wrote on the channel of the model process "
                                             f"{worker} (a copy or a child of it speaking for the run); refused")
            return False
        self.received += len(data)
        if self.received > self.max_bytes:
            self.finding("too-large", f"the model process sent over {self.max_bytes // 2**20} MiB")
            return False
        self._buf += data
        return True

    def _next_frame(self) -> dict[str, Any] | None:
        if len(self._buf) < HEADER.size:
            return None
        (size,) = HEADER.unpack(self._buf[:HEADER.size])
        if len(self._buf) < HEADER.size + size:
            return None
        raw = bytes(self._buf[HEADER.size:HEADER.size + size])
        del self._buf[:HEADER.size + size]
        try:
            frame = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return {"t": "?", "error": f"not JSON: {exc}"[:200]}
        return frame if isinstance(frame, dict) else {"t": "?", "error": "not an object"}

    def _handle(self, frame: dict[str, Any], sock: socket.socket, worker: int, start: float) -> bool:
        kind = frame.get("t")
        now = time.monotonic()
        if not self._hello:
            if kind != "hello":
                self.finding("protocol", f"the first frame was {kind!r}, not hello")
                return False
            self._hello = True
            self._identity = identity(worker)
            if self._identity is None:
                self.finding("unverified", "the worker's memory layout is not readable here: an exec of the "
                                           "model process into another program would not be seen")
            send_frame(sock, {"t": "ack"})
            return True
        if not self._same_program(worker):
            return False
        if kind == "ready" and self.load_s is None:
            self.load_s = now - start
        elif kind == "begin" and self._open is None and len(self.sections) < MAX_SECTIONS:
            send_frame(sock, {"t": "go"})
            self._open = {"label": str(frame.get("label", ""))[:200], "go": time.monotonic()}
        elif kind == "end" and self._open is not None and str(frame.get("label", ""))[:200] == self._open["label"]:
            claims = {k: v for k, v in frame.items() if k not in ("t", "label")}
            self.sections.append({"label": self._open["label"], "s": now - self._open["go"], "claims": claims})
            self._open = None
        elif kind == "result":
            result = frame.get("result")
            self.claims = result if isinstance(result, dict) else None
            return False
        else:
            self.finding("protocol", f"unexpected frame {kind!r} (hello again, an unopened section, a second ready)")
            return False
        return True

    def _same_program(self, worker: int) -> bool:
        now = identity(worker)
        if self._identity is not None and now is not None and now != self._identity:
            self.finding("replaced", "the model process is no longer the program npuport started (it exec'd "
                                     "another program, e.g. a copy of the harness in another mode); refused")
            return False
        return True

    def _finish(self, proc: subprocess.Popen[bytes]) -> int | None:
        """The worker's exit status; once its result is in, it gets a short grace to exit and is then
        killed (an interpreter's teardown is nobody's time), which is not held against it (None)."""
        deadline = time.monotonic() + (EXIT_GRACE_S if self.claims is None else AFTER_RESULT_S)
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if self.claims is not None:
                return None
        return proc.returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _prctl(PR_SET_DUMPABLE, 0)  # first: nothing of this process is readable through /proc by the worker
    fd = os.environ.pop(RESULT_FD_ENV, None)
    if fd is None:
        print("npuport supervisor: no result channel (HARNESS_RESULT_FD)", file=sys.stderr)
        return 2
    channel = os.fdopen(int(fd), "wb", closefd=True)
    os.set_inheritable(channel.fileno(), False)
    conf = json.loads(argv[0])
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the worker's tree stay ours to see and reap
    sup = Supervisor(list(conf["worker"]), int(conf.get("max_bytes") or (8 << 20)), bool(conf.get("watch", True)))
    try:
        out = sup.run()
    except Exception as exc:  # the supervisor's own failure is reported, never a silent success
        out = {"supervisor": {"findings": [{"kind": "supervisor-error", "detail": f"{type(exc).__name__}: {exc}"}],
                              "sections": [], "processes": []}, "claims": None}
    with channel:
        channel.write(json.dumps(out, default=str).encode())
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
