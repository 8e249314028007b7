"""H4 codemod ``fused-attention``: softmax(QK^T * scale + bias) V -> ``_npuport_attention``, which calls
torch_npu.npu_fusion_attention on an NPU (bias as ``pse``) and the model's own code elsewhere."""

from __future__ import annotations

from typing import Any

import libcst as cst

from agents.rules.h4.fused import (
    ATTENTION_HELPER,
    ATTENTION_MARKER,
    NPU_MARKER,
    NPU_PRELUDE,
    Block,
    simple_operand,
)
from agents.rules.kit import (
    CodemodResult,
    PerfRewriter,
    Rename,
    assigned_names,
    code_of,
    dotted_name,
    is_int,
    kwarg,
    name_uses,
    paren,
    run_codemod,
    single_assign,
    walk,
)

# ----------------------------------------------------------------------------------------------
# 3c. fused-attention (H4)
# ----------------------------------------------------------------------------------------------


class _Attn:
    """What a matched softmax(QK^T * scale + bias) V holds, as code."""

    def __init__(self) -> None:
        self.q = self.k = self.v = ""
        self.scale = "1.0"
        self.bias: str | None = None
        self.defs: set[int] = set()      # statements folded into the expression
        self.reads: dict[int, set[str]] = {}  # names each folded statement reads


class _AttnMatcher:
    def __init__(self, block: Block, index: int) -> None:
        self.block = block
        self.index = index
        self.attn = _Attn()

    def resolve(self, e: cst.BaseExpression, at: int) -> tuple[cst.BaseExpression, int]:
        """A name defined earlier in the block -> its value (and where); else e itself."""
        while isinstance(e, cst.Name):
            d = self.block.definition(e.value, at)
            if d is None:
                break
            self.attn.defs.add(d[0])
            self.attn.reads[d[0]] = set(name_uses(d[1]))
            e, at = d[1], d[0]
        return e, at

    def matmul(self, e: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.MatrixMultiply):
            return e.left, e.right
        if isinstance(e, cst.Call) and dotted_name(e.func) == "torch.matmul" and len(e.args) == 2 \
                and all(a.keyword is None for a in e.args):
            return e.args[0].value, e.args[1].value
        return None

    def match_pv(self, e: cst.BaseExpression) -> bool:
        mm = self.matmul(e)
        if mm is None:
            return False
        p, at = self.resolve(mm[0], self.index)
        v = mm[1]
        if not simple_operand(v):
            return False
        self.attn.v = code_of(v)
        # optional .to(<q|k|v>.dtype) after a softmax(..., dtype=torch.float32)
        cast_to: str | None = None
        if isinstance(p, cst.Call) and isinstance(p.func, cst.Attribute) and p.func.attr.value == "to" \
                and len(p.args) == 1 and isinstance(p.args[0].value, cst.Attribute) \
                and p.args[0].value.attr.value == "dtype":
            cast_to = code_of(p.args[0].value.value)
            p, at = self.resolve(p.func.value, at)
        s = self.softmax_input(p, cast_to is not None)
        if s is None:
            return False
        s, at = self.resolve(s, at)
        if not self.scores(s, at):
            return False
        return cast_to is None or cast_to in (self.attn.q, self.attn.k, self.attn.v)

    def softmax_input(self, p: cst.BaseExpression, cast: bool) -> cst.BaseExpression | None:
        if not isinstance(p, cst.Call):
            return None
        name = dotted_name(p.func)
        if isinstance(p.func, cst.Attribute) and p.func.attr.value == "softmax" and \
                name not in ("torch.softmax", "F.softmax", "torch.nn.functional.softmax", "nn.functional.softmax"):
            s, rest = p.func.value, list(p.args)
        elif name in ("torch.softmax", "F.softmax", "torch.nn.functional.softmax", "nn.functional.softmax") \
                and p.args and p.args[0].keyword is None:
            s, rest = p.args[0].value, list(p.args[1:])
        else:
            return None
        dim = kwarg(p, "dim")
        dtype = kwarg(p, "dtype")
        positional = [a for a in rest if a.keyword is None]
        dim_val = dim.value if dim is not None else (positional[0].value if positional else None)
        if not is_int(dim_val, -1) or len(positional) > 1 or len(rest) != len(positional) + (dim is not None) \
                + (dtype is not None):
            return None
        if dtype is not None and (dotted_name(dtype.value) != "torch.float32" or not cast):
            return None
        return s

    def scores(self, s: cst.BaseExpression, at: int) -> bool:
        """QK [* scale | / d] [+ bias], or (Q * scale) @ K^T [+ bias]."""
        if isinstance(s, cst.BinaryOperation) and isinstance(s.operator, cst.Add):
            for sc, bias in ((s.left, s.right), (s.right, s.left)):
                sc_r, sc_at = self.resolve(sc, at) if isinstance(sc, cst.Name) else (sc, at)
                saved = set(self.attn.defs)
                if self.scaled_qk(sc_r, sc_at) and not self._has_matmul(bias):
                    self.attn.bias = code_of(bias)
                    self.attn.reads.setdefault(at, set())
                    return True
                self.attn.defs = saved
            return False
        return self.scaled_qk(s, at)

    @staticmethod
    def _has_matmul(e: cst.CSTNode) -> bool:
        return any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.MatrixMultiply)
                   for n in walk(e))

    def scaled_qk(self, e: cst.BaseExpression, at: int) -> bool:
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Multiply | cst.Divide):
            for qk, scale in ((e.left, e.right), (e.right, e.left)):
                if isinstance(e.operator, cst.Divide) and qk is e.right:
                    continue
                qk_r, _ = self.resolve(qk, at) if isinstance(qk, cst.Name) else (qk, at)
                if simple_operand(scale) or isinstance(scale, cst.Integer | cst.Float | cst.Call):
                    if isinstance(scale, cst.Call) and dotted_name(scale.func) not in ("math.sqrt",):
                        continue
                    if self.qk(qk_r):
                        self.attn.scale = code_of(scale) if isinstance(e.operator, cst.Multiply) \
                            else f"1.0 / {code_of(paren(scale))}"
                        return True
            return False
        return self.qk(e)

    def qk(self, e: cst.BaseExpression) -> bool:
        mm = self.matmul(e)
        if mm is None:
            return False
        q, kt = mm
        if isinstance(q, cst.BinaryOperation) and isinstance(q.operator, cst.Multiply) and simple_operand(q.left) \
                and self.attn.scale == "1.0":
            q_base, scale = q.left, q.right
            if not (simple_operand(scale) or isinstance(scale, cst.Integer | cst.Float)):
                return False
            self.attn.scale = code_of(scale)
            q = q_base
        k: cst.BaseExpression | None = None
        if isinstance(kt, cst.Call) and isinstance(kt.func, cst.Attribute) and kt.func.attr.value == "transpose" \
                and len(kt.args) == 2 and {code_of(a.value) for a in kt.args} == {"-2", "-1"}:
            k = kt.func.value
        elif isinstance(kt, cst.Attribute) and kt.attr.value == "mT":
            k = kt.value
        if k is None or not simple_operand(q) or not simple_operand(k):
            return False
        self.attn.q, self.attn.k = code_of(q), code_of(k)
        return True


class _Attention(PerfRewriter):
    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        block = Block(updated.body)
        drop: set[int] = set()
        for i, st in enumerate(updated.body):
            if not isinstance(st, cst.SimpleStatementLine) or i in drop:
                continue
            rewriter = _AttnRewriter(block, i, drop)
            new_st = st.visit(rewriter)
            if rewriter.hit is None or not isinstance(new_st, cst.SimpleStatementLine):
                continue
            defined = {n for d in rewriter.hit.defs for n in assigned_names(block.stmts[d])}
            if defined & set(name_uses(new_st)):
                continue  # the statement still reads a folded name outside the attention: leave it
            assert isinstance(new_st, cst.SimpleStatementLine)
            block.stmts[i] = new_st
            drop |= rewriter.hit.defs
            self.note(original.body[i],
                      "softmax(QK^T)V -> _npuport_attention (torch_npu.npu_fusion_attention on an NPU)")
        if not drop:
            return updated
        return updated.with_changes(body=[s for i, s in enumerate(block.stmts) if i not in drop])


class _AttnRewriter(cst.CSTTransformer):
    def __init__(self, block: Block, index: int, dropped: set[int]) -> None:
        super().__init__()
        self.block = block
        self.index = index
        self.dropped = dropped
        self.hit: _Attn | None = None

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation) -> cst.BaseExpression:
        return self._try(original, updated)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        return self._try(original, updated)

    def _try(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.BaseExpression:
        if self.hit is not None:
            return updated
        matcher = _AttnMatcher(self.block, self.index)
        if not matcher.match_pv(original):
            return updated
        a = matcher.attn
        if a.defs & self.dropped or not self._safe(a):
            return updated
        inlined = _inline(self.block, a.defs, original, self.index)
        bias = "None" if a.bias is None else f"lambda: {a.bias}"
        code = f"_npuport_attention({a.q}, {a.k}, {a.v}, {a.scale}, {bias}, lambda: {code_of(inlined)})"
        self.hit = a
        return cst.parse_expression(code).with_changes(lpar=original.lpar, rpar=original.rpar)

    def _safe(self, a: _Attn) -> bool:
        """Folding the definitions into this statement must not change what they compute (nothing they
        read is rebound before this statement), and the names they define must be read nowhere else."""
        defined: set[str] = set()
        for d in a.defs:
            pair = single_assign(self.block.stmts[d])
            if pair is None:
                return False
            defined.add(pair[0])
        for d in a.defs:
            reads = a.reads.get(d, set()) - defined
            if any(reads & assigned_names(self.block.stmts[j]) for j in range(d + 1, self.index) if j not in a.defs):
                return False
        for name in defined:
            folded = sum(name_uses(self.block.stmts[d]).count(name) for d in a.defs)
            here = name_uses(self.block.stmts[self.index]).count(name)
            if self.block.reads(name, set()) != folded + here:
                return False
        return True


def _inline(block: Block, defs: set[int], e: cst.BaseExpression, at: int, depth: int = 0) -> cst.BaseExpression:
    """e with every name whose definition (as seen from statement `at`) is folded replaced by its value."""
    replacements: dict[str, cst.BaseExpression] = {}
    for n in set(name_uses(e)):
        d = block.definition(n, at)
        if d is not None and d[0] in defs and depth < 16:
            replacements[n] = paren(_inline(block, defs, d[1], d[0], depth + 1))
    if not replacements:
        return e
    return _Substitute(replacements).transform(e)


class _Substitute(Rename):
    def __init__(self, values: dict[str, cst.BaseExpression]) -> None:
        super().__init__({})
        self.values = values

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        return self.values.get(original.value, updated)


def fused_attention(source: str, **_: Any) -> CodemodResult:
    return run_codemod(source, lambda _m: _Attention(),
                       [(NPU_PRELUDE, NPU_MARKER), (ATTENTION_HELPER, ATTENTION_MARKER)])
