"""What takes privilege away from a bwrap run: a user namespace with a non-root uid, every capability
dropped, no further user namespaces, and a seccomp filter for the system calls that reach other
namespaces, the mount table, the kernel or other processes.

bwrap started by root keeps root and every capability inside the sandbox unless told otherwise; in a
new mount namespace that is enough to remount the host read-write, unmount the masks or enter the
parent's namespaces. With ``--unshare-user --uid 65534`` the model runs as an unprivileged user of a
namespace it does not own: the host's mounts are locked, capabilities are empty. The seccomp filter
is a second wall for kernels where a namespace gives more than it should.

The filter is a classic BPF program (what libseccomp would compile), built here so no native
binding is needed; bwrap reads it from a file descriptor (``--seccomp FD``).
"""

from __future__ import annotations

import errno
import os
import platform
import struct

SANDBOX_UID = 65534  # "nobody": the uid the model's code has inside the run, whoever started it
SANDBOX_GID = 65534

# seccomp_data: nr (u32) at 0, arch (u32) at 4, args (u64 each) from 16; little endian on both arches.
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# CLONE_NEW* flags: a clone() that asks for a new namespace is refused like unshare(). (CLONE_NEWTIME,
# 0x80, exists only for clone3, which is refused; in clone() that bit belongs to the exit signal.)
_CLONE_NS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# Refused system calls, by architecture (audit arch, numbers). Namespaces and mounts (mount, umount2,
# pivot_root, chroot, the new mount API, setns, unshare), other processes (ptrace, process_vm_*,
# pidfd_*, kcmp), the kernel itself (modules, kexec, bpf, perf, keyrings, reboot, swap, io_uring,
# userfaultfd, open_by_handle_at, which reads files by handle past any mount).
_NAMES = ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
          "fspick", "mount_setattr", "setns", "unshare", "ptrace", "process_vm_readv", "process_vm_writev",
          "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp", "init_module", "finit_module", "delete_module",
          "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "keyctl", "add_key", "request_key", "reboot",
          "swapon", "swapoff", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
          "open_by_handle_at", "name_to_handle_at", "acct", "quotactl", "lookup_dcookie")
_X86_64 = dict(zip(_NAMES, (165, 166, 155, 161, 428, 429, 430, 431, 432, 433, 442, 308, 272, 101, 310, 311, 434, 438,
                            424, 312, 175, 313, 176, 246, 320, 321, 298, 250, 248, 249, 169, 167, 168, 425, 426, 427,
                            323, 304, 303, 163, 179, 212), strict=True))
_AARCH64 = dict(zip(_NAMES, (40, 39, 41, 51, 428, 429, 430, 431, 432, 433, 442, 268, 97, 117, 270, 271, 434, 438,
                             424, 272, 105, 273, 106, 104, 294, 280, 241, 219, 217, 218, 142, 224, 225, 425, 426, 427,
                             282, 265, 264, 89, 60, 18), strict=True))
# (audit arch, syscall numbers, clone, clone3)
_ARCHES: dict[str, tuple[int, dict[str, int], int, int]] = {
    "x86_64": (0xC000003E, _X86_64, 56, 435),
    "aarch64": (0xC00000B7, _AARCH64, 220, 435),
}


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The compiled filter for this machine's architecture, or None where we have no syscall table."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers, clone, clone3 = arch
    deny = _ERRNO | errno.EPERM
    nrs = sorted(set(numbers.values()))
    # Layout: arch check, load nr, x32 check, one jeq per refused nr, then the 7-instruction tail
    # (clone3 -> ENOSYS, clone -> flags check, ALLOW, ENOSYS, DENY). Jumps count from the next instruction.
    prog: list[bytes] = []
    n_checks = len(nrs)
    prog.append(_ins(_LD_W_ABS, 4))
    prog.append(_ins(_JEQ, audit_arch, 1, 0))
    prog.append(_ins(_RET, deny))  # another ABI (i386 on x86_64, arm32 on aarch64): refused outright
    prog.append(_ins(_LD_W_ABS, 0))
    tail = 7  # instructions after the nr checks
    # x86_64's x32 ABI numbers its calls from 0x40000000 under the same audit arch: refused outright
    prog.append(_ins(_JGE, _X32_BIT, n_checks + tail - 1, 0) if audit_arch == 0xC000003E
                else _ins(_JEQ, 0xFFFFFFFF, n_checks + tail - 1, 0))
    for i, nr in enumerate(nrs):
        prog.append(_ins(_JEQ, nr, n_checks - 1 - i + tail - 1, 0))
    prog.append(_ins(_JEQ, clone3, 4, 0))  # -> ENOSYS: libc falls back to clone(), whose flags we can see
    prog.append(_ins(_JEQ, clone, 0, 2))  # -> check flags / -> ALLOW
    prog.append(_ins(_LD_W_ABS, 16))  # clone's flags (low 32 bits of arg 0)
    prog.append(_ins(_JSET, _CLONE_NS, 2, 0))  # a new namespace -> DENY
    prog.append(_ins(_RET, _ALLOW))
    prog.append(_ins(_RET, _ERRNO | errno.ENOSYS))
    prog.append(_ins(_RET, deny))
    return b"".join(prog)


def confinement(filter_fd: int | None) -> list[str]:
    """bwrap options that take privilege away (the seccomp program, if any, is read from ``filter_fd``)."""
    args = ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns",
            "--cap-drop", "ALL"]
    if filter_fd is not None:
        args += ["--seccomp", str(filter_fd)]
    return args


def seccomp_fd() -> int | None:
    """A file descriptor holding the compiled filter (the caller passes it to bwrap and closes it)."""
    prog = seccomp_program()
    if prog is None:
        return None
    fd = os.memfd_create("npuport-seccomp", os.MFD_CLOEXEC)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
