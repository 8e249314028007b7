"""torch's own op registry: every aten op of the installed torch, with its composite kind and whether it is
a view (the base the op-support matrix is built over). torch is imported inside the function only."""

from __future__ import annotations

from dataclasses import dataclass

from knowledge.matrix_symbols import OpName


@dataclass
class AtenRegistry:
    torch_version: str
    ops: dict[str, OpName]  # key -> name parts
    composite: dict[str, str]  # key -> implicit | explicit | nonfunctional
    views: set[str]

    @property
    def names(self) -> set[str]:
        return {o.name for o in self.ops.values()}


def aten_registry() -> AtenRegistry:
    """Every aten op of the installed torch, with its composite kind and whether it is a view."""
    import torch  # heavy; only here

    # The dispatcher's names are the ops; the JIT schemas add out-ness and aliasing (and also
    # hold TorchScript-only builtins such as add.str, which are left out).
    dispatcher = {
        n.removeprefix("aten::") for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")
    }
    ops: dict[str, OpName] = {}
    views: set[str] = set()
    for s in torch._C._jit_get_all_schemas():
        name = s.name.removeprefix("aten::")
        op = OpName(name, s.overload_name, any(a.is_out for a in s.arguments))
        if not s.name.startswith("aten::") or op.key not in dispatcher:
            continue
        ops.setdefault(op.key, op)
        rets = [r.alias_info for r in s.returns]
        if rets and rets[0] is not None and not rets[0].is_write:
            views.add(op.key)
    for k in dispatcher - set(ops):
        name, _, overload = k.partition(".")
        ops[k] = OpName(name, overload, overload.endswith("out"))
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    composite: dict[str, str] = {}
    for k in ops:
        full = f"aten::{k}"
        if has(full, "CompositeImplicitAutograd"):
            composite[k] = "implicit"
        elif has(full, "CompositeExplicitAutograd"):
            composite[k] = "explicit"
        elif has(full, "CompositeExplicitAutogradNonFunctional"):
            composite[k] = "nonfunctional"
    return AtenRegistry(torch.__version__.split("+")[0], ops, composite, views)
