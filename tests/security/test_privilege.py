"""Class: privilege inside the sandbox. An attacker who knows bwrap was started by root (the usual
container) tries what root with a new mount namespace could do: remount the host writable, unmount
the masks, reach other processes' /proc, enter the parent's namespaces, make new namespaces, trace
or steal from processes. Every probe reports what it got; the test asserts it got nothing.

Run as root these attack a root-started bwrap; run as a normal user (bench/security.py --as-user)
the same probes attack an unprivileged one."""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import pytest

from sandbox.isolation.process import Limits

from .conftest import needs_isolation

LIBC = '''
import ctypes, errno as _errno, json
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
def _call(fn, *args):
    r = fn(*args)
    return "ok" if r >= 0 else _errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
def _report(d):
    open("probe.json", "w").write(json.dumps(d))
'''


def _probe(a) -> dict:  # type: ignore[no-untyped-def]
    assert a.run.ok, a.run.result
    return json.loads((a.run.run_dir / "probe.json").read_text())


def test_the_model_runs_without_uid_0_or_capabilities(attack, box) -> None:  # type: ignore[no-untyped-def]
    needs_isolation(box)
    code = LIBC + '''
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
_report({"uid": os.getuid(), "euid": os.geteuid(), "cap_eff": status["CapEff"].strip(),
         "cap_bnd": status["CapBnd"].strip(), "cap_amb": status["CapAmb"].strip()})
'''
    p = _probe(attack(code))
    assert p["uid"] != 0 and p["euid"] != 0
    assert int(p["cap_eff"], 16) == 0 and int(p["cap_bnd"], 16) == 0 and int(p["cap_amb"], 16) == 0


def test_remounting_the_model_tree_writable_fails(attack, box, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs_isolation(box)
    model = tmp_path / "work" / "model"
    code = LIBC + f'''
MS_REMOUNT, MS_BIND = 32, 4096
got = {{}}
for target in ("/", {str(model)!r}):
    got[target] = _call(_libc.mount, None, target.encode(), None, MS_REMOUNT | MS_BIND, None)
try:
    open({str(model / "pwned.py")!r}, "w").write("x = 1\\n")
    got["write"] = "ok"
except OSError as e:
    got["write"] = type(e).__name__
_report(got)
'''
    a = attack(code)
    p = _probe(a)
    assert p["write"] != "ok" and not (model / "pwned.py").exists(), p
    assert p["/"] != "ok" and p[str(model)] != "ok", p


def test_the_masks_cannot_be_unmounted(attack, box, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Unmounting the private /tmp and /proc would reveal the host's: a file the server keeps under
    /tmp, and /proc of every host process (the server's environment and tokens)."""
    needs_isolation(box)
    secret = tmp_path / "server-secret.txt"
    secret.write_text("host-secret-2b9f")
    code = LIBC + f'''
MNT_DETACH = 2
got = {{"umount_tmp": _call(_libc.umount2, b"/tmp", MNT_DETACH),
       "umount_proc": _call(_libc.umount2, b"/proc", MNT_DETACH)}}
try:
    got["secret"] = open({str(secret)!r}).read()
except OSError as e:
    got["secret"] = type(e).__name__
try:
    got["server_status"] = open("/proc/{os.getpid()}/status").read()[:200]
except OSError as e:
    got["server_status"] = type(e).__name__
_report(got)
'''
    p = _probe(attack(code))
    assert "host-secret-2b9f" not in json.dumps(p), p
    assert not str(p["server_status"]).startswith("Name:"), "the host's /proc was reachable"
    assert p["umount_tmp"] != "ok" and p["umount_proc"] != "ok", p


def test_the_parent_namespaces_cannot_be_entered(attack, box) -> None:  # type: ignore[no-untyped-def]
    """setns into the server's network namespace (through the host's /proc, once /proc is unmounted)
    would reach the host network and the API; nothing may connect to a listener on the host."""
    needs_isolation(box)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    code = LIBC + f'''
import socket
got = {{"umount_proc": _call(_libc.umount2, b"/proc", 2)}}
try:
    fd = os.open("/proc/{os.getpid()}/ns/net", os.O_RDONLY)
    got["setns"] = _call(_libc.setns, fd, 0)
except OSError as e:
    got["setns"] = type(e).__name__
for path in ("/proc/1/ns/net", "/proc/self/ns/user"):
    try:
        got[path] = _call(_libc.setns, os.open(path, os.O_RDONLY), 0)
    except OSError as e:
        got[path] = type(e).__name__
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    got["net"] = "connected"
except OSError as e:
    got["net"] = type(e).__name__
_report(got)
'''
    try:
        p = _probe(attack(code))
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()
    assert p["net"] != "connected" and p["setns"] != "ok", p


def test_namespace_tracing_and_kernel_calls_are_refused(attack, box) -> None:  # type: ignore[no-untyped-def]
    """The seccomp filter: new namespaces (unshare, clone with CLONE_NEW*), ptrace, pidfd_*, keyrings,
    bpf, the mount API. Each returns EPERM; ordinary fork, threads and subprocesses still work."""
    needs_isolation(box)
    code = LIBC + '''
import platform, subprocess, threading
nr = {"x86_64": {"unshare": 272, "ptrace": 101, "pidfd_open": 434, "keyctl": 250, "bpf": 321, "fsopen": 430,
                 "clone": 56},
      "aarch64": {"unshare": 97, "ptrace": 117, "pidfd_open": 434, "keyctl": 219, "bpf": 280, "fsopen": 430,
                  "clone": 220}}[platform.machine()]
sc = _libc.syscall
got = {"unshare_user": _call(sc, nr["unshare"], 0x10000000),
       "unshare_mnt": _call(sc, nr["unshare"], 0x00020000),
       "ptrace_traceme": _call(sc, nr["ptrace"], 0, 0, 0, 0),
       "pidfd_open": _call(sc, nr["pidfd_open"], os.getpid(), 0),
       "keyctl": _call(sc, nr["keyctl"], 0, -3, 0),
       "bpf": _call(sc, nr["bpf"], 0, 0, 0),
       "fsopen": _call(sc, nr["fsopen"], ctypes.c_char_p(b"tmpfs"), 0),
       "clone_newuser": _call(sc, nr["clone"], 0x10000000 | 17, 0, 0, 0, 0)}
got["subprocess"] = subprocess.run(["true"]).returncode
t = threading.Thread(target=lambda: None); t.start(); t.join()
got["thread"] = "ok"
_report(got)
'''
    p = _probe(attack(code))
    for call in ("unshare_user", "unshare_mnt", "ptrace_traceme", "pidfd_open", "keyctl", "bpf", "fsopen",
                 "clone_newuser"):
        assert p[call] == "EPERM", (call, p)
    assert p["subprocess"] == 0 and p["thread"] == "ok"


def test_root_only_host_files_stay_unreadable(attack, box) -> None:  # type: ignore[no-untyped-def]
    """The run's uid maps to the server's outside: files only the server's user may read (/etc/shadow
    for root) must be masked, not just protected by a uid check that maps to their owner."""
    needs_isolation(box)
    private = [p for p in ("/etc/shadow", "/etc/gshadow") if Path(p).exists()]
    if not private:
        pytest.skip("no /etc/shadow here")
    code = LIBC + f'''
got = {{}}
for p in {private!r}:
    try:
        got[p] = open(p).read()[:100]
    except OSError as e:
        got[p] = type(e).__name__
_report(got)
'''
    p = _probe(attack(code))
    for path in private:
        assert ":" not in p[path], (path, p[path][:20])


def test_npuport_home_outside_the_masks_is_invisible(attack, box, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """NPUPORT_HOME outside /root, /home and /tmp (the docs' /srv or /var example) holds every owner's
    uploads, workspaces, bundles and job database: a run sees none of it, nor any other host folder
    outside the allow-list."""
    needs_isolation(box)
    home = Path(tempfile.mkdtemp(prefix="npuport-home-", dir="/var/tmp"))
    try:
        (home / "uploads" / "other-owner").mkdir(parents=True)
        (home / "uploads" / "other-owner" / "weights.txt").write_text("other-owner-data-51c2")
        (home / "jobs.sqlite").write_text("job-db-7d1e")
        monkeypatch.setenv("NPUPORT_HOME", str(home))
        code = LIBC + f'''
import glob
got = {{"listing": glob.glob({str(home)!r} + "/**", recursive=True), "var": sorted(glob.glob("/var/*"))}}
for p in ({str(home / "uploads" / "other-owner" / "weights.txt")!r}, {str(home / "jobs.sqlite")!r}):
    try:
        got[p] = open(p).read()
    except OSError as e:
        got[p] = type(e).__name__
_report(got)
'''
        p = _probe(attack(code))
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)
    text = json.dumps(p)
    assert "other-owner-data-51c2" not in text and "job-db-7d1e" not in text, p
    assert not [x for x in p["listing"] if x.rstrip("/") != str(home)], p["listing"]


def test_tmpfs_is_sized(attack, box) -> None:  # type: ignore[no-untyped-def]
    """tmpfs is host RAM outside RLIMIT_AS: a run that fills /tmp hits its size, not the host's memory."""
    needs_isolation(box)
    code = LIBC + '''
written = 0
try:
    with open("/tmp/fill", "wb") as fh:
        for _ in range(64):
            fh.write(b"\\0" * (1 << 20))
            fh.flush()
            written += 1
    got = {"mb": written, "error": None}
except OSError as e:
    got = {"mb": written, "error": _errno.errorcode.get(e.errno)}
_report(got)
'''
    p = _probe(attack(code, limits=Limits(wall_s=60, tmpfs_mb=16)))
    assert p["error"] == "ENOSPC" and p["mb"] <= 16, p
