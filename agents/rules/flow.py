"""A small intra-function dataflow (simple assignments only) over one module: it backs the pattern
detectors, the softmax(QK^T)V attention and the RMSNorm formula (H4) and the mixed-device ``torch.cat``,
in-place writes into expanded views and masked_scatter with a CUDA mask (H11)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import libcst as cst

from agents.rules.cst_helpers import dotted, is_cuda_device_string, kwarg, last_name, string_value, walk_nodes


class FlowContext(Protocol):
    """What the dataflow reads of a module (agents/rules/context.py's ModuleContext provides it)."""

    ix: Any  # the module's index: statements, parents

    @property
    def fallback_devices(self) -> list[cst.CSTNode]: ...

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None: ...

    def ancestors(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]: ...

    def qual(self, node: cst.CSTNode) -> str: ...

    def is_module_ref(self, node: cst.CSTNode) -> bool: ...

@dataclass(frozen=True)
class _Val:
    """What an expression carries: attention/norm pattern tags, device origin, view-ness."""

    tags: frozenset[str] = frozenset()
    site: cst.CSTNode | None = None  # the softmax call that produced attention probabilities

    def sticky(self) -> frozenset[str]:
        return self.tags - {"expanded"}

    def origins(self) -> frozenset[str]:
        return frozenset(t for t in self.tags if t.startswith("o:"))


_EMPTY = _Val()
_SOFTMAX = {"softmax", "_softmax"}
_MATMUL = {"matmul", "bmm", "mm", "einsum"}
_VIEW_METHODS = {"view", "transpose", "permute", "unsqueeze", "squeeze", "narrow", "select", "t", "diagonal",
                 "as_strided", "unflatten", "movedim", "expand", "expand_as"}
_CAT_FUNCS = {"torch.cat", "torch.concat", "torch.concatenate", "torch.stack", "torch.hstack", "torch.vstack"}
_PLACE_WORDS = {"o:cpu": "the CPU", "o:cuda": "CUDA", "o:devvar": "a cuda-else-cpu device variable"}
_METADATA_ATTRS = {"shape", "dtype", "ndim", "is_cuda", "requires_grad"}


class Flow:
    def __init__(self, ctx: FlowContext) -> None:
        self.ctx = ctx
        self.fallbacks = set(ctx.fallback_devices)
        self.attention_sites: list[tuple[cst.CSTNode, str]] = []
        self.rms_sites: list[cst.CSTNode] = []
        self.mixed_cats: list[tuple[cst.Call, set[str]]] = []
        self.inplace_expanded: list[cst.CSTNode] = []
        self.masked_scatter_cuda: list[cst.Call] = []
        self.env: dict[str, _Val] = {}

    def run(self) -> None:
        by_fn: dict[cst.CSTNode | None, list[cst.CSTNode]] = {}
        for st in self.ctx.ix.statements:
            by_fn.setdefault(self.ctx.function_of(st), []).append(st)
        module_env: dict[str, _Val] = {}
        shared: dict[str, _Val] = {}  # `self.x` values, carried from __init__ to forward
        for fn, stmts in sorted(by_fn.items(), key=lambda kv: kv[0] is not None):
            self.env = dict(module_env) | shared if fn is not None else module_env
            for st in stmts:
                self.statement(st)
            if fn is None:
                module_env = self.env
            shared |= {k: v for k, v in self.env.items() if k.startswith("self.") and v.origins()}

    def statement(self, st: cst.CSTNode) -> None:
        if isinstance(st, cst.Assign):
            v = self.eval(st.value)
            in_fallback_if = any(a in self.fallbacks for a, _ in self.ctx.ancestors(st))
            if in_fallback_if:
                v = _Val(v.tags | {"o:devvar"})
            for t in st.targets:
                self.bind(t.target, v)
        elif isinstance(st, cst.AnnAssign) and st.value is not None:
            self.bind(st.target, self.eval(st.value))
        elif isinstance(st, cst.AugAssign):
            v = self.eval(st.value)
            key = dotted(st.target)
            cur = self.env.get(key, _EMPTY) if key else self.eval(st.target)
            base = self.eval(st.target.value) if isinstance(st.target, cst.Subscript) else cur
            if "expanded" in base.tags:
                self.inplace_expanded.append(st)
            tags = cur.tags | v.sticky()
            if isinstance(st.operator, cst.AddAssign | cst.SubtractAssign) and "matmul" in cur.tags:
                tags |= {"bias"}
            if key:
                self.env[key] = _Val(tags, cur.site or v.site)
        elif isinstance(st, cst.Expr | cst.Return) and st.value is not None:
            self.eval(st.value)

    def bind(self, target: cst.BaseExpression, v: _Val) -> None:
        key = dotted(target)
        if key:
            self.env[key] = v
        elif isinstance(target, cst.Subscript):
            if "expanded" in self.eval(target.value).tags:
                self.inplace_expanded.append(target)
        elif isinstance(target, cst.Tuple | cst.List):
            for el in target.elements:
                self.bind(el.value, _Val(v.sticky() - {"softmax"}))

    # --- expressions --------------------------------------------------------------------------
    def eval(self, e: cst.CSTNode) -> _Val:
        if isinstance(e, cst.Name):
            return self.env.get(e.value, _EMPTY)
        if isinstance(e, cst.Attribute):
            key = dotted(e)
            if key and key in self.env:
                return self.env[key]
            if e.attr.value in _METADATA_ATTRS:
                return _EMPTY
            base = self.eval(e.value)
            if e.attr.value == "device":
                return _Val(base.origins())
            return base if e.attr.value in ("T", "mT", "data") else _Val(base.sticky())
        if isinstance(e, cst.SimpleString | cst.FormattedString):
            s = string_value(e)
            return _Val(frozenset({"o:cpu"})) if s == "cpu" else \
                _Val(frozenset({"o:cuda"})) if is_cuda_device_string(s) else _EMPTY
        if isinstance(e, cst.IfExp):
            if e in self.fallbacks:
                return _Val(frozenset({"o:devvar"}))
            return _union(self.eval(e.body), self.eval(e.orelse))
        if isinstance(e, cst.BinaryOperation):
            return self.binop(e)
        if isinstance(e, cst.UnaryOperation):
            return self.eval(e.expression)
        if isinstance(e, cst.Subscript):
            return self.eval(e.value)
        if isinstance(e, cst.List | cst.Tuple):
            return _Val(frozenset().union(*[self.eval(el.value).sticky() for el in e.elements]))
        if isinstance(e, cst.Call):
            return self.call(e)
        return _EMPTY

    def binop(self, e: cst.BinaryOperation) -> _Val:
        left, right = self.eval(e.left), self.eval(e.right)
        tags = left.sticky() | right.sticky()
        op = e.operator
        if isinstance(op, cst.MatrixMultiply):
            self.consume_attention(left, right)
            return _Val(_origins(tags) | {"matmul"})
        if isinstance(op, cst.Add | cst.Subtract) and "matmul" in tags:
            return _Val(tags | {"bias"}, left.site or right.site)
        if isinstance(op, cst.Power) and isinstance(e.right, cst.Integer) and e.right.value == "2":
            return _Val(tags | {"sq"})
        if isinstance(op, cst.Multiply) and dotted(e.left) and dotted(e.left) == dotted(e.right):
            return _Val(tags | {"sq"})
        return _Val(tags, left.site or right.site)

    def call(self, e: cst.Call) -> _Val:
        ctx = self.ctx
        f = e.func
        name = last_name(f)
        q = ctx.qual(f)
        is_method = isinstance(f, cst.Attribute) and not ctx.is_module_ref(f.value)
        recv = self.eval(f.value) if is_method and isinstance(f, cst.Attribute) else _EMPTY
        args = [self.eval(a.value) for a in e.args]
        first = recv if is_method and recv.tags else (args[0] if args else _EMPTY)
        union = _union(recv, *args)
        if q in _CAT_FUNCS:
            self.check_cat(e)
        if name in _SOFTMAX:
            src = recv if is_method and recv.tags else first
            if "matmul" in src.tags:
                extra = {"bias"} & src.tags or {"mask"} & src.tags
                return _Val(src.origins() | {"softmax"} | extra, e)
            return _Val(union.sticky())
        if name in _MATMUL or name == "baddbmm":
            self.consume_attention(recv, *args)
            return _Val(union.origins() | {"matmul"} | ({"bias"} if name == "baddbmm" else set()))
        if name in ("rsqrt", "sqrt"):
            if "meansq" in first.tags:
                self.rms_sites.append(e)
            return _Val(union.sticky() - {"meansq"})
        if name == "pow" and len(e.args) >= (1 if is_method else 2) and \
                isinstance(e.args[-1].value, cst.Integer) and e.args[-1].value.value == "2":
            return _Val(first.sticky() | {"sq"})
        if name == "square":
            return _Val(first.sticky() | {"sq"})
        if name == "mean" and "sq" in first.tags:
            return _Val(first.sticky() - {"sq"} | {"meansq"})
        if name in ("masked_fill", "masked_fill_") and is_method:
            return _Val(recv.tags | ({"mask"} if "matmul" in recv.tags else set()), recv.site)
        if is_method and name in _VIEW_METHODS:
            return _Val(recv.tags | ({"expanded"} if name in ("expand", "expand_as") else set()), recv.site)
        if is_method and name.endswith("_") and not name.startswith("_") and "expanded" in recv.tags:
            self.inplace_expanded.append(e)
        if name in ("masked_scatter", "masked_scatter_") and e.args:
            mask = e.args[0].value
            if "o:cuda" in args[0].tags or any(isinstance(n, cst.Call) and last_name(n.func) == "cuda"
                                               for n in walk_nodes(mask)):
                self.masked_scatter_cuda.append(e)
        if is_method and name in ("cuda", "cpu", "to"):
            if name == "cuda":
                new = frozenset({"o:cuda"})
            elif name == "cpu":
                new = frozenset({"o:cpu"})
            else:
                new = _origins(frozenset().union(*[a.tags for a in args]))
            if new:
                return _Val(recv.sticky() - _origins(recv.tags) | new, recv.site)
            return _Val(recv.sticky(), recv.site)
        dev = kwarg(e, "device")
        if dev is not None:
            origin = self.eval(dev.value).origins()
            return _Val(union.sticky() - union.origins() | origin)
        return _Val(union.sticky(), union.site)

    def consume_attention(self, *operands: _Val) -> None:
        for v in operands:
            if "softmax" in v.tags and v.site is not None:
                kind = "bias" if "bias" in v.tags else "mask" if "mask" in v.tags else ""
                self.attention_sites.append((v.site, kind))

    def check_cat(self, e: cst.Call) -> None:
        seq = e.args[0].value if e.args else None
        if not isinstance(seq, cst.List | cst.Tuple) or len(seq.elements) < 2:
            return
        per_el = [self.eval(el.value).origins() for el in seq.elements]
        named = {o.removeprefix("o:") for s in per_el for o in s}
        risky = {"cpu", "devvar"} & named
        distinct = {s for s in per_el}
        if risky and len(distinct) >= 2:
            places = {" or ".join(sorted(_PLACE_WORDS[o] for o in s)) if s else "wherever its input is"
                      for s in per_el}
            self.mixed_cats.append((e, places))


def _origins(tags: frozenset[str]) -> frozenset[str]:
    return frozenset(t for t in tags if t.startswith("o:"))


def _union(*vals: _Val) -> _Val:
    tags: frozenset[str] = frozenset()
    site = None
    for v in vals:
        tags |= v.sticky()
        site = site or v.site
    return _Val(tags, site)

