"""The parts of H6's vectorise-mask-loops that read a loop (agents/rules/h6/codemods.py rewrites it): which
tensor fills it makes under which index conditions, and the loop's bounds and bodies as vector
expressions over index grids. Anything outside what they understand raises ``_Unsupported``."""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m

from agents.rules.kit import (
    Rename,
    dotted_name,
    name_uses,
    paren,
)

_TENSOR_CREATORS = {"full", "zeros", "ones", "empty", "full_like", "zeros_like", "ones_like", "empty_like"}
_PURE_CALLS = {"len", "int", "float", "min", "max", "abs", "round", "torch.finfo", "torch.iinfo"}
_ROW, _COL = "_npuport_row", "_npuport_col"


class _Unsupported(Exception):
    """The loop is not one we understand: leave it as written."""


class _Fill:
    def __init__(self, conds: list[cst.BaseExpression], target: cst.Subscript, value: cst.BaseExpression) -> None:
        self.conds = conds
        self.target = target
        self.value = value


def _nonneg(e: cst.BaseExpression, loop_vars: frozenset[str]) -> bool:
    """Provably >= 0: non-negative literals and outer loop variables (themselves >= 0) under + and *."""
    if isinstance(e, cst.Integer):
        return True
    if isinstance(e, cst.Name):
        return e.value in loop_vars
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Add | cst.Multiply):
        return _nonneg(e.left, loop_vars) and _nonneg(e.right, loop_vars)
    return False


def _range_args(loop: cst.For, outer_vars: frozenset[str] = frozenset()) -> tuple[cst.BaseExpression | None,
                                                                                  cst.BaseExpression]:
    """for v in range([start,] stop) with start provably >= 0 (so v is a position) -> (start, stop)."""
    it = loop.iter
    if loop.orelse is not None or loop.asynchronous is not None or not isinstance(loop.target, cst.Name):
        raise _Unsupported
    if not (isinstance(it, cst.Call) and m.matches(it.func, m.Name("range"))):
        raise _Unsupported
    args = it.args
    if any(a.keyword is not None or a.star for a in args) or len(args) not in (1, 2):
        raise _Unsupported
    if len(args) == 1:
        return None, args[0].value
    start = args[0].value
    if not _nonneg(start, outer_vars):
        raise _Unsupported
    return start, args[1].value


def _collect_fills(stmts: Sequence[cst.BaseStatement], conds: list[cst.BaseExpression], out: list[_Fill]) -> None:
    for st in stmts:
        if isinstance(st, cst.SimpleStatementLine):
            for s in st.body:
                if isinstance(s, cst.Pass):
                    continue
                if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Subscript):
                    out.append(_Fill(conds, s.targets[0].target, s.value))
                    continue
                raise _Unsupported
        elif isinstance(st, cst.If):
            _collect_if(st, conds, out)
        else:
            raise _Unsupported


def _collect_if(st: cst.If, conds: list[cst.BaseExpression], out: list[_Fill]) -> None:
    _collect_fills(_block(st.body), [*conds, st.test], out)
    negated = [*conds, cst.UnaryOperation(cst.Not(), st.test)]
    if isinstance(st.orelse, cst.If):
        _collect_if(st.orelse, negated, out)
    elif isinstance(st.orelse, cst.Else):
        _collect_fills(_block(st.orelse.body), negated, out)


def _block(body: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    if isinstance(body, cst.IndentedBlock):
        return body.body
    raise _Unsupported  # `if c: x[i] = 0` on one line: rare, not handled


class _VecExpr:
    """Checks and translates expressions of the loop: loop variables become index grids."""

    def __init__(self, grids: dict[str, str], tensor: str, local_defs: dict[str, cst.BaseExpression]) -> None:
        self.grids = grids
        self.tensor = tensor
        self.local_defs = local_defs

    def uses_grid(self, e: cst.CSTNode) -> bool:
        return any(n in self.grids for n in name_uses(e))

    def check(self, e: cst.BaseExpression) -> None:
        """Raise unless e is side-effect free and made of arithmetic, comparisons and boolean logic;
        the tensor itself may appear only through .shape/.dtype/.device/.size()."""
        if isinstance(e, cst.Integer | cst.Float | cst.SimpleString):
            return
        if isinstance(e, cst.Name):
            if e.value == self.tensor:
                raise _Unsupported
        elif isinstance(e, cst.Attribute):
            self._check_attribute(e)
        elif isinstance(e, cst.Subscript):
            self._check_subscript(e)
        elif isinstance(e, cst.UnaryOperation):
            if isinstance(e.operator, cst.BitInvert):
                raise _Unsupported
            self.check(e.expression)
        elif isinstance(e, cst.BinaryOperation):
            if isinstance(e.operator, cst.MatrixMultiply | cst.BitAnd | cst.BitOr | cst.BitXor | cst.LeftShift
                          | cst.RightShift):
                raise _Unsupported
            self.check(e.left)
            self.check(e.right)
        elif isinstance(e, cst.BooleanOperation):
            self.check(e.left)
            self.check(e.right)
        elif isinstance(e, cst.Comparison):
            self._check_comparison(e)
        elif isinstance(e, cst.Call):
            self._check_call(e)
        else:
            raise _Unsupported

    def _check_attribute(self, e: cst.Attribute) -> None:
        if isinstance(e.value, cst.Name) and e.value.value == self.tensor:
            if e.attr.value not in ("shape", "dtype", "device"):
                raise _Unsupported
            return
        if self.uses_grid(e):
            raise _Unsupported
        self.check(e.value)

    def _check_subscript(self, e: cst.Subscript) -> None:
        if self.uses_grid(e):
            raise _Unsupported  # x[i]: data-dependent indexing, not a vectorisable bound
        self.check(e.value)
        for el in e.slice:
            if not isinstance(el.slice, cst.Index):
                raise _Unsupported
            self.check(el.slice.value)

    def _check_comparison(self, e: cst.Comparison) -> None:
        self.check(e.left)
        for c in e.comparisons:
            if not isinstance(c.operator, cst.LessThan | cst.LessThanEqual | cst.GreaterThan
                              | cst.GreaterThanEqual | cst.Equal | cst.NotEqual):
                raise _Unsupported
            self.check(c.comparator)

    def _check_call(self, e: cst.Call) -> None:
        """t.size(...) without the grids, or a pure built-in (only ``abs`` may take a grid)."""
        name = dotted_name(e.func)
        if (isinstance(e.func, cst.Attribute) and dotted_name(e.func.value) == self.tensor
                and e.func.attr.value == "size"):
            if self.uses_grid(e):
                raise _Unsupported
            return
        if name not in _PURE_CALLS or (self.uses_grid(e) and name != "abs"):
            raise _Unsupported
        for a in e.args:
            if a.star:
                raise _Unsupported
            self.check(a.value)

    def translate(self, e: cst.BaseExpression) -> cst.BaseExpression:
        """Loop variables -> grids; `and`/`or`/`not` over grid values -> `&`/`|`/`~`."""
        if not self.uses_grid(e):
            return e
        if isinstance(e, cst.Name):
            return cst.Name(self.grids[e.value])
        if isinstance(e, cst.BooleanOperation):
            op: cst.BaseBinaryOp = cst.BitAnd() if isinstance(e.operator, cst.And) else cst.BitOr()
            return cst.BinaryOperation(paren(self.translate(e.left)), op, paren(self.translate(e.right)))
        if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
            return cst.UnaryOperation(cst.BitInvert(), paren(self.translate(e.expression)))
        if isinstance(e, cst.Comparison) and len(e.comparisons) > 1:
            parts: list[cst.BaseExpression] = []
            left = e.left
            for c in e.comparisons:
                parts.append(paren(self.translate(cst.Comparison(left, [c.with_changes()]))))
                left = c.comparator
            out = parts[0]
            for p in parts[1:]:
                out = cst.BinaryOperation(out, cst.BitAnd(), p)
            return out
        return Rename(self.grids).transform(e)


def _and_all(parts: list[cst.BaseExpression]) -> cst.BaseExpression:
    out = paren(parts[0])
    for p in parts[1:]:
        out = cst.BinaryOperation(out, cst.BitAnd(), paren(p))
    return out


def _scalar_value(e: cst.BaseExpression, local_defs: dict[str, cst.BaseExpression], depth: int = 0) -> bool:
    """A loop-invariant scalar fill value: literals, True/False/None-free constants, float("inf"),
    torch.finfo(...).min/max, arithmetic of those, or a local name bound to one."""
    if depth > 5:
        return False
    if isinstance(e, cst.Integer | cst.Float):
        return True
    if isinstance(e, cst.Name):
        if e.value in ("True", "False"):
            return True
        return e.value in local_defs and _scalar_value(local_defs[e.value], local_defs, depth + 1)
    if isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Minus | cst.Plus):
        return _scalar_value(e.expression, local_defs, depth + 1)
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Add | cst.Subtract | cst.Multiply
                                                         | cst.Divide):
        return _scalar_value(e.left, local_defs, depth + 1) and _scalar_value(e.right, local_defs, depth + 1)
    if isinstance(e, cst.Call) and dotted_name(e.func) == "float" and len(e.args) == 1:
        return isinstance(e.args[0].value, cst.SimpleString) or _scalar_value(e.args[0].value, local_defs, depth + 1)
    if isinstance(e, cst.Attribute) and e.attr.value in ("min", "max") and isinstance(e.value, cst.Call):
        return dotted_name(e.value.func) in ("torch.finfo", "torch.iinfo")
    return False
