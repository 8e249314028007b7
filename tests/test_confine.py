"""The seccomp program sandbox/isolation/confine.py builds, run through a small classic-BPF interpreter for each
architecture it knows: refused calls get EPERM, clone3 ENOSYS, clone with a namespace flag EPERM,
ordinary calls (and clone for threads and fork) are allowed, another ABI is refused outright."""

from __future__ import annotations

import struct

import pytest

from sandbox.isolation.confine import _ALLOW, _ARCHES, _ERRNO, seccomp_program

EPERM, ENOSYS = 1, 38


def _run(prog: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    data = struct.pack("=iIQ", nr, arch, 0) + struct.pack("=6Q", arg0, 0, 0, 0, 0, 0)
    ins = [struct.unpack("=HBBI", prog[i:i + 8]) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = ins[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # jeq / jge / jset
            hit = acc == k if code == 0x15 else (acc >= k if code == 0x35 else bool(acc & k))
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")


@pytest.mark.parametrize("machine", sorted(_ARCHES))
def test_the_filter_refuses_what_it_lists_and_allows_the_rest(machine: str) -> None:
    audit, numbers, clone, clone3 = _ARCHES[machine]
    prog = seccomp_program(machine)
    assert prog is not None and len(prog) % 8 == 0
    for name, nr in numbers.items():
        assert _run(prog, audit, nr) == _ERRNO | EPERM, name
    assert _run(prog, audit, clone3) == _ERRNO | ENOSYS
    assert _run(prog, audit, clone, 0x10000000 | 17) == _ERRNO | EPERM  # CLONE_NEWUSER
    assert _run(prog, audit, clone, 0x00020000 | 17) == _ERRNO | EPERM  # CLONE_NEWNS
    assert _run(prog, audit, clone, 17) == _ALLOW  # fork
    assert _run(prog, audit, clone, 0x3D0F00) == _ALLOW  # pthread_create's flags
    for nr in (0, 1, 2, 3, 9, 60, 63, 222, 231):  # read, write, mmap, exit... on either table
        if nr not in numbers.values() and nr not in (clone, clone3):
            assert _run(prog, audit, nr) == _ALLOW, nr
    assert _run(prog, 0x40000003, 1) == _ERRNO | EPERM  # i386 / arm32: another ABI
    if machine == "x86_64":
        assert _run(prog, audit, 0x40000000 | 1) == _ERRNO | EPERM  # x32


def test_an_unknown_architecture_gets_no_filter() -> None:
    assert seccomp_program("riscv64") is None
