"""What ``libtorch_npu.so`` says: kernel wrapper symbols and CPU-fallback warnings.

torch's codegen names each kernel wrapper ``wrapper_<DispatchKey>_<overload>_<cpp name>``
(``wrapper_NPU_Tensor_add`` = ``add.Tensor``, ``wrapper_NPU__masked_scatter_`` =
``masked_scatter_``, ``wrapper_NPU_out_add_out`` = ``add.out``: out= variants get ``_out``).
torch_npu's custom-op registrations leave the key out (``wrapper__npu_rms_norm``). In the
binary the names sit inside mangled type names, length-prefixed (``22wrapper_NPU_Tensor_add``),
so the identifier's end is exact; the overload/op split is ambiguous (both contain ``_``) and
is resolved against the names torch's own op registry and the yaml know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from knowledge.wheel import LIB_MEMBER, WheelReader, iter_anchors

# Dispatch keys torch_npu registers kernels under (longest first, so "SparseCsrNPU" wins over "NPU").
DISPATCH_KEYS = ("AutogradNPU", "SparseCsrNPU", "QuantizedNPU", "SparseNPU", "NPU")

# Literal anchors (fast to find); the text around each is read from the buffer.
_ANCHORS = re.compile(
    rb"wrapper_[A-Za-z0-9_]+|XadL_ZN9op_plugin\d+|is not supported by NPU currently|will fall back to run on the CPU"
    rb"|the operator will fall back to CPU"
)
# Fallback sentences torch_npu prints; the op name is what the kernel or the fallback names.
_FALLBACK_RES = (
    re.compile(r"kernel \[([A-Za-z0-9_.]+)\] is not supported by NPU currently"),
    re.compile(r"^([A-Za-z0-9_.]+) is not supported by NPU currently"),
    re.compile(
        r"The operator 'aten::([A-Za-z0-9_.]+)' is not currently supported on the NPU backend "
        r"and will fall back to run on the CPU"
    ),
    re.compile(
        r"the NPU interface does not support operator 'aten::([A-Za-z0-9_.]+)', "
        r"the operator will fall back to CPU"
    ),
)
_ANON_NS = b"_GLOBAL__N_"  # the anonymous namespace "_GLOBAL__N_1" ends in a digit
# A kernel registered as a plain function pointer, without a codegen wrapper (quantized ops):
# ``CompileTimeFunctionPointer<..., &op_plugin::int_repr>`` mangles as ``XadL_ZN9op_plugin8int_reprE``.
_DIRECT_RE = re.compile(rb"XadL_ZN9op_plugin(\d+)")


@dataclass
class LibScan:
    """Raw findings of one pass over the library."""

    wrappers: set[str] = field(default_factory=set)  # "wrapper_NPU_Tensor_add", exact identifiers
    direct: set[str] = field(default_factory=set)  # op_plugin functions registered without a wrapper
    # fallback op name as printed -> the sentence the binary holds
    fallback_messages: dict[str, str] = field(default_factory=dict)


def scan_library(reader: WheelReader) -> LibScan:
    """One streamed pass over libtorch_npu.so (never loaded, never fully in memory)."""
    scan = LibScan()
    for buf, pos in iter_anchors(reader, LIB_MEMBER, _ANCHORS):
        if buf.startswith(b"wrapper_", pos):
            ident = _length_prefixed_ident(buf, pos)
            if ident:
                scan.wrappers.add(ident)
            continue
        d = _DIRECT_RE.match(buf, pos)
        if d is not None:
            n = int(d.group(1))
            name = buf[d.end() : d.end() + n]
            if (
                len(name) == n
                and re.fullmatch(rb"[A-Za-z0-9_]+", name)
                and buf[d.end() + n : d.end() + n + 1] == b"E"
            ):
                scan.direct.add(name.decode())
            continue
        text = _c_string_at(buf, pos)
        for rx in _FALLBACK_RES:
            f = rx.search(text)
            if f is not None:
                scan.fallback_messages.setdefault(f.group(1), text.strip())
                break
    return scan


def _length_prefixed_ident(buf: bytes, pos: int) -> str | None:
    """The identifier at ``pos`` cut at its mangled length prefix; None if there is none."""
    i = pos
    while i > 0 and pos - i < 4 and buf[i - 1 : i].isdigit():
        i -= 1
    digits = buf[i:pos]
    if buf[max(0, i - len(_ANON_NS)) : i] == _ANON_NS:
        digits = digits[1:]  # that digit belongs to "_GLOBAL__N_1"
    if not digits:
        return None
    n = int(digits)
    ident = buf[pos : pos + n]
    if n < len(b"wrapper_x") or len(ident) < n or not re.fullmatch(rb"[A-Za-z0-9_]+", ident):
        return None
    return ident.decode()


def _c_string_at(buf: bytes, pos: int) -> str:
    """The NUL-delimited printable string around ``pos`` (as the ``strings`` tool would see it)."""
    start = buf.rfind(b"\0", max(0, pos - 2048), pos) + 1
    end = buf.find(b"\0", pos, pos + 2048)
    return buf[start : end if end >= 0 else pos + 2048].decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Wrapper:
    ident: str
    dispatch_key: str  # "" for key-less (custom op) registrations
    rest: str  # "<overload>_<cpp name>"


def split_key(ident: str) -> Wrapper:
    body = ident.removeprefix("wrapper_")
    for k in DISPATCH_KEYS:
        if body.startswith(k + "_"):
            return Wrapper(ident, k, body[len(k) + 1 :])
    return Wrapper(ident, "", body)


@dataclass(frozen=True)
class OpName:
    name: str
    overload: str
    is_out: bool

    @property
    def key(self) -> str:
        return f"{self.name}.{self.overload}" if self.overload else self.name


def wrapper_table(ops: list[OpName]) -> dict[str, list[str]]:
    """``<overload>_<cpp name>`` -> op keys that codegen would give that wrapper name."""
    table: dict[str, list[str]] = {}
    for op in ops:
        cpp = op.name + ("_out" if op.is_out else "")
        keys = table.setdefault(f"{op.overload}_{cpp}", [])
        if op.key not in keys:
            keys.append(op.key)
    return table


def resolve(rest: str, table: dict[str, list[str]], known_names: set[str]) -> tuple[str | None, str]:
    """(op key, how): exact table hit, else a split whose op name is known, else (None, "unresolved")."""
    hit = table.get(rest)
    if hit:
        return hit[0], "exact" if len(hit) == 1 else "ambiguous"
    # Unknown overload: try every "_" as the overload/op boundary, keep splits naming a known op.
    for i, ch in enumerate(rest):
        if ch != "_":
            continue
        overload, cpp = rest[:i], rest[i + 1 :]
        for name in (cpp, cpp.removesuffix("_out")):
            if name in known_names:
                return (f"{name}.{overload}" if overload else name), "split"
    return None, "unresolved"


def normalise_fallback_name(raw: str, known_keys: set[str]) -> str:
    """``complex_out`` -> ``complex.out`` when that is the real op; otherwise as printed."""
    if raw in known_keys:
        return raw
    if raw.endswith("_out") and f"{raw[:-4]}.out" in known_keys:
        return f"{raw[:-4]}.out"
    return raw
