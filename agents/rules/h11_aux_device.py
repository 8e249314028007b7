"""H11, auxiliary tensors made on the CPU in the forward path: ``torch.zeros(b, n, dtype=torch.long)`` (type ids,
position ids, masks) created without ``device=`` beside inputs that live on the accelerator. On a CUDA host
such code often only ran because CPU index tensors are accepted there; on Ascend it is a device-mismatch
error or a host-to-device copy every step. The fix creates them on the device of a tensor argument of the same
function (``device=x.device``): on the CPU nothing changes, on the NPU they are born where they are used."""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

from agents.rules.base import Registry
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import walk_nodes
from agents.rules.kit import CodemodResult, Rewriter, dotted_name, run_codemod

FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "rand", "randn", "randint", "eye", "linspace"}
# reading one of these off a parameter shows it is a tensor
_TENSOR_USES = {"shape", "device", "dtype", "size", "flatten", "view", "reshape", "transpose", "permute", "to",
                "unsqueeze", "squeeze", "dim", "contiguous", "expand", "type_as", "float", "half", "bfloat16"}


def tensor_anchor(fn: cst.FunctionDef) -> str | None:
    """A parameter of fn that is a tensor wherever it is read (annotated Tensor or used as one, and only ever
    rebound to a method chain of itself): the device the aux tensors are created on."""
    params = [p for p in (*fn.params.posonly_params, *fn.params.params) if p.name.value not in ("self", "cls")]
    if any(p.name.value == "device" for p in params) and _only_self_rebinds(fn, "device"):
        return "device"  # the function is told its device: device=device (None keeps the default, as before)
    for p in params:
        name = p.name.value
        annotated = p.annotation is not None and "Tensor" in cst.Module(body=[]).code_for_node(p.annotation.annotation)
        used = any(isinstance(n, cst.Attribute) and isinstance(n.value, cst.Name) and n.value.value == name
                   and n.attr.value in _TENSOR_USES for n in walk_nodes(fn.body))
        if not (annotated or used) or not _only_self_rebinds(fn, name):
            continue
        return name
    return None


def _only_self_rebinds(fn: cst.FunctionDef, name: str) -> bool:
    for n in walk_nodes(fn.body):
        if isinstance(n, cst.FunctionDef | cst.Lambda) and n is not fn and \
                name in {p.name.value for p in n.params.params}:
            return False
        if isinstance(n, cst.For | cst.CompFor | cst.WithItem | cst.NamedExpr):
            target = getattr(n, "target", None) or getattr(getattr(n, "asname", None), "name", None)
            if target is not None and any(isinstance(t, cst.Name) and t.value == name for t in walk_nodes(target)):
                return False
        if isinstance(n, cst.Assign):
            hits = [t for t in n.targets if any(isinstance(x, cst.Name) and x.value == name
                                                for x in walk_nodes(t.target))]
            simple = len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name)
            if hits and not (simple and _method_chain_of(n.value, name)):
                return False
    return True


def _method_chain_of(e: cst.BaseExpression, name: str) -> bool:
    """x.flatten(2).transpose(1, 2) and the like: a tensor method chain rooted at name."""
    while isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute):
        e = e.func.value
    return isinstance(e, cst.Name) and e.value == name


def aux_sites(ctx: ModuleContext) -> list[tuple[cst.Call, str | None, str]]:
    """(factory call, anchor parameter or None, hot function) for torch factory calls without a device in the
    forward path."""
    out: list[tuple[cst.Call, str | None, str]] = []
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if not q.startswith("torch.") or q.count(".") != 1 or q.split(".")[1] not in FACTORIES:
            continue
        if any(a.keyword is not None and a.keyword.value == "device" for a in call.args) or \
                any(a.star == "**" for a in call.args):
            continue
        if _moved_in_chain(ctx, call):
            continue
        hot = ctx.in_hot_path(call)
        fn = ctx.function_of(call)
        if not hot or fn is None:
            continue
        out.append((call, tensor_anchor(fn), hot))
    return out


def _moved_in_chain(ctx: ModuleContext, call: cst.Call) -> bool:
    """torch.arange(n).float().to(device): moved later in the same method chain."""
    node: cst.CSTNode = call
    while True:
        parent = ctx.parent(node)
        if not isinstance(parent, cst.Attribute) or parent.value is not node:
            return False
        if parent.attr.value in ("to", "cuda", "npu", "cpu", "type_as"):
            return True
        grand = ctx.parent(parent)
        if not isinstance(grand, cst.Call):
            return False
        node = grand


class _OnDevice(Rewriter):
    def __init__(self, sites: dict[tuple[int, int], str]) -> None:
        super().__init__()
        self.sites = sites

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        pos = self.get_metadata(PositionProvider, original).start
        anchor = self.sites.get((pos.line, pos.column))
        if anchor is None:
            return updated
        where = anchor if anchor == "device" else f"{anchor}.device"
        device = cst.Arg(keyword=cst.Name("device"), value=cst.parse_expression(where),
                         equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                               whitespace_after=cst.SimpleWhitespace("")))
        args = list(updated.args)
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        self.note(original, f"{dotted_name(updated.func)}(...) made on the CPU in the forward path -> "
                            f"device={where} (where the tensors it is used with live)")
        return updated.with_changes(args=[*args, device])


def aux_tensors_on_device(source: str, file: str = "model.py", **_: Any) -> CodemodResult:
    ctx = ModuleContext(file, source, cst.parse_module(source), Registry(()))  # reads the index; adds no finding
    sites = {ctx.pos(call): anchor for call, anchor, _hot in aux_sites(ctx) if anchor is not None}
    return run_codemod(source, lambda _m: _OnDevice(sites))
