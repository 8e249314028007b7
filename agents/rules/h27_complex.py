"""H27: complex tensors on the NPU path (torch.complex64/complex128, torch.polar, view_as_complex/view_as_real,
torch.fft.*). Most aclnn kernels reject complex dtypes (EZ1001 "not implemented for DT_COMPLEX64"): indexing a
complex rotary table by position ids, dividing an FFT's spectrum, an inverse FFT of a complex input.

What the math allows is rewritten into real arithmetic (``complex-to-real``):
- a unit-magnitude table, ``torch.polar(torch.ones_like(a), a)`` (LLaMA's ``freqs_cis``), is kept as its real
  angle ``a`` (``_npuport_unit_phase``: views, indexing and moves act on the angle, any other op sees the
  complex value, so the meaning is the original's);
- an elementwise complex product read as real pairs, ``torch.view_as_real(x * f)``, is computed on real/imag
  planes (cos/sin of the angle for such a table): ``_npuport_mul_as_real(x, f)``.

An FFT path is kept on the NPU when the op matrix of the target's torch_npu lists complex input dtypes for
the inverse/complex FFT kernels it needs (``_fft_c2r``, ``_fft_c2c``); otherwise the function holding it runs
as an explained CPU island (``complex-cpu-island``): its tensor arguments go to the CPU and its results come
back, a host sync per tensor argument each call, and the patch says why. One hazard class, one module (see
docs/rules.md)."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

from agents.models import Frame, StructuredException
from agents.rules.base import BLOCKS, HIGH, LOW, MEDIUM, ErrorPattern, Fix, HazardRule, Signature
from agents.rules.context import ModuleContext
from agents.rules.cst_helpers import aliases, dotted, kwarg
from agents.rules.kit import CodemodResult, Rewriter, code_of, run_codemod, walk
from agents.rules.kit_complex import ISLAND_HELPERS, PHASE_HELPERS
from sandbox.targets import Target

HAZARD = "H27"
COMPLEX_DTYPES = {"torch.complex64", "torch.complex128", "torch.complex32", "torch.cfloat", "torch.cdouble",
                  "torch.chalf"}
COMPLEX_CALLS = {"torch.view_as_complex", "torch.view_as_real", "torch.polar", "torch.complex"}
# torch.fft functions -> the aten FFT kernel each reaches and whether that kernel's input is complex
FFT_KERNELS = {"rfft": ("_fft_r2c", False), "rfft2": ("_fft_r2c", False), "rfftn": ("_fft_r2c", False),
               "ihfft": ("_fft_r2c", False), "irfft": ("_fft_c2r", True), "irfft2": ("_fft_c2r", True),
               "irfftn": ("_fft_c2r", True), "hfft": ("_fft_c2r", True), "fft": ("_fft_c2c", True),
               "ifft": ("_fft_c2c", True), "fft2": ("_fft_c2c", True), "ifft2": ("_fft_c2c", True),
               "fftn": ("_fft_c2c", True), "ifftn": ("_fft_c2c", True)}
_COMPLEX_DT = re.compile(r"not implemented for (DT_COMPLEX\w*)")


# --- what the op matrix says about complex kernels ------------------------------------------------

@lru_cache(maxsize=8)
def _matrix_at(path: str, mtime: float) -> Any:
    from knowledge.op_matrix import load_matrix

    try:
        return load_matrix(Path(path))
    except Exception:  # noqa: BLE001 - an unreadable matrix is no matrix
        return None


def op_matrix(target: Target | None = None) -> Any:
    """The op matrix of the target's torch_npu (its resolved ``matrix_path``), else the knowledge base's."""
    from knowledge.op_matrix import matrix_path
    from knowledge.settings import settings

    given = target.options.get("matrix_path") if target is not None else None
    path = Path(given) if given else matrix_path(settings().kb_torch_npu)
    return _matrix_at(str(path), path.stat().st_mtime) if path.is_file() else None


def complex_kernel(matrix: Any, op: str) -> tuple[bool, str]:
    """(the NPU runs ``op`` on complex inputs, what the matrix says): a kernel of its own whose dtype list
    names a complex dtype. A kernel with no dtype list is not taken to accept complex inputs (aclnn kernels
    mostly do not), and the reason says so."""
    if matrix is None:
        return False, f"no op matrix is stored, so no NPU kernel of {op} is known to take complex inputs"
    ver = matrix.torch_npu_version
    if not matrix.has_npu_kernel(op):
        return False, f"{op} has no NPU kernel in the op matrix of torch_npu {ver}"
    dtypes = matrix.dtypes(op) or []
    if any("complex" in str(d).lower() for d in dtypes):
        return True, f"{op} takes complex inputs on the NPU per the op matrix of torch_npu {ver}"
    listed = f"lists only {', '.join(map(str, dtypes))}" if dtypes else "lists no complex input dtype for it"
    return False, f"{op} has an NPU kernel in the op matrix of torch_npu {ver} but the matrix {listed}"


def fft_verdict(fft_names: list[str], target: Target | None = None) -> tuple[bool, str]:
    """(the function's FFTs run on the NPU, why): every kernel that takes a complex input takes it there."""
    matrix = op_matrix(target)
    reasons = []
    for name in sorted(set(fft_names)):
        op, takes_complex = FFT_KERNELS.get(name, ("_fft_c2c", True))
        if not takes_complex:
            continue
        ok, why = complex_kernel(matrix, op)
        if not ok:
            reasons.append(f"torch.fft.{name} needs {op} on a complex input: {why}")
    if reasons:
        return False, "; ".join(reasons)
    return True, "its FFT kernels take complex inputs on the NPU per the op matrix"


# --- the analysis the detector and the codemods share ---------------------------------------------

def _qualifier(module: cst.Module) -> Callable[[cst.CSTNode], str]:
    imports = [n for n in walk(module) if isinstance(n, cst.Import | cst.ImportFrom)]
    table = aliases(imports)

    def qual(node: cst.CSTNode) -> str:
        d = dotted(node)
        if not d:
            return ""
        head, _, rest = d.partition(".")
        full = table.get(head)
        return d if full is None else (f"{full}.{rest}" if rest else full)

    return qual


def unit_phase_angle(call: cst.Call, qual: Callable[[cst.CSTNode], str]) -> cst.BaseExpression | None:
    """``torch.polar(torch.ones_like(a), a)`` -> ``a`` (a unit-magnitude table); None for any other polar."""
    if qual(call.func) != "torch.polar" or len(call.args) != 2 or any(a.keyword for a in call.args):
        return None
    mag, angle = call.args[0].value, call.args[1].value
    if isinstance(mag, cst.Call) and qual(mag.func) == "torch.ones_like" and len(mag.args) == 1 \
            and code_of(mag.args[0].value) == code_of(angle):
        return angle
    return None


def product_operands(call: cst.Call, qual: Callable[[cst.CSTNode], str]) -> tuple[cst.BaseExpression, ...] | None:
    """``torch.view_as_real(x * f)`` / ``torch.view_as_real(torch.mul(x, f))`` -> (x, f)."""
    if qual(call.func) != "torch.view_as_real" or len(call.args) != 1:
        return None
    inner = call.args[0].value
    if isinstance(inner, cst.BinaryOperation) and isinstance(inner.operator, cst.Multiply):
        return inner.left, inner.right
    if isinstance(inner, cst.Call) and qual(inner.func) == "torch.mul" and len(inner.args) == 2 \
            and not any(a.keyword for a in inner.args):
        return inner.args[0].value, inner.args[1].value
    return None


def fft_calls(fn: cst.FunctionDef, qual: Callable[[cst.CSTNode], str]) -> list[str]:
    """The torch.fft functions a function calls (not those of functions nested in it)."""
    out = []
    for n in walk(fn.body):
        if isinstance(n, cst.Call) and (q := qual(n.func)).startswith("torch.fft."):
            out.append(q.removeprefix("torch.fft."))
    return out


def island_obstacle(fn: cst.FunctionDef) -> str | None:
    """Why the function cannot be a CPU island (None: it can): it reads its module's own tensors through
    ``self``, which an island would copy to the host every call; or it is a generator."""
    params = [p.name.value for p in fn.params.params]
    if params[:1] == ["self"] and any(isinstance(n, cst.Name) and n.value == "self" for n in walk(fn.body)):
        return f"`{fn.name.value}` reads its module's own state through self (weights an island would copy each call)"
    if any(isinstance(n, cst.Yield) for n in walk(fn.body)):
        return f"`{fn.name.value}` is a generator"
    return None


def is_island(fn: cst.FunctionDef) -> bool:
    return any(isinstance(d.decorator, cst.Call) and dotted(d.decorator.func) == "_npuport_cpu_island"
               for d in fn.decorators)


# --- detector ----------------------------------------------------------------------------------

def _h27_complex(ctx: ModuleContext) -> None:
    qual = ctx.qual
    for ref in ctx.refs:
        if ref.qual in COMPLEX_DTYPES:
            ctx.add(HAZARD, "complex-dtype", ref.node,
                    f"`{ref.qual}`: complex tensors on the NPU path; most aclnn kernels reject complex dtypes "
                    "(EZ1001), complex128 runs on AICPU; a failing op's function becomes a CPU island at run time "
                    "unless its math is rewritten into real pairs", BLOCKS, MEDIUM, fixable=False)
    for call in ctx.ix.calls:
        q = qual(call.func)
        if q in COMPLEX_CALLS:
            _complex_call(ctx, call, q)
        elif q.startswith("torch.fft.") and q.removeprefix("torch.fft.") in FFT_KERNELS:
            _fft_call(ctx, call, q)
        else:
            dt = kwarg(call, "dtype")
            if dt is not None and isinstance(dt.value, cst.Name) and dt.value.value == "complex" \
                    and q.startswith("torch."):
                ctx.add(HAZARD, "complex-dtype", dt, "dtype=complex means complex128 in torch, which the NPU's "
                        "kernels do not compute (AICPU at best)", BLOCKS, MEDIUM, fixable=False)


def _complex_call(ctx: ModuleContext, call: cst.Call, q: str) -> None:
    if q == "torch.polar":
        angle = unit_phase_angle(call, ctx.qual)
        ctx.add(HAZARD, "complex-dtype", call,
                "`torch.polar(torch.ones_like(a), a)`: a complex table (rotary freqs_cis) whose indexing and "
                "arithmetic NPU kernels reject; kept as its real angle (cos/sin at use)" if angle is not None else
                "`torch.polar` with a magnitude other than ones: a complex table the NPU's kernels reject "
                "(polar itself falls back to the CPU)", BLOCKS, HIGH, fixable=angle is not None)
    elif q == "torch.view_as_real":
        pair = product_operands(call, ctx.qual)
        ctx.add(HAZARD, "complex-dtype", call,
                "`torch.view_as_real(x * f)`: an elementwise complex product read as real pairs; computed on "
                "real/imag planes instead" if pair else
                "`torch.view_as_real`: a view of a complex tensor (no kernel); the complex math before it is what "
                "the NPU rejects", BLOCKS, HIGH if pair else LOW, fixable=pair is not None)
    elif q == "torch.view_as_complex":
        ctx.add(HAZARD, "complex-dtype", call,
                "`torch.view_as_complex`: a complex view (no kernel of its own); the products and indexing on it "
                "are what NPU kernels reject (a product read back with view_as_real is rewritten into real planes)",
                BLOCKS, MEDIUM, fixable=False)
    else:
        ctx.add(HAZARD, "complex-dtype", call, "`torch.complex(re, im)` builds a complex tensor, which most NPU "
                "kernels reject (and `complex` falls back to the CPU)", BLOCKS, MEDIUM, fixable=False)


def _fft_call(ctx: ModuleContext, call: cst.Call, q: str) -> None:
    fn = ctx.function_of(call)
    # the function is the unit: an island takes all its FFTs to the CPU, or none
    on_npu, why = fft_verdict(fft_calls(fn, ctx.qual) if fn is not None else [q.removeprefix("torch.fft.")])
    if on_npu:
        ctx.add(HAZARD, "complex-fft", call, f"`{q}`: kept on the NPU ({why})", BLOCKS, LOW, fixable=False)
        return
    obstacle = "it is not inside a function" if fn is None else island_obstacle(fn)
    where = f"`{fn.name.value}`" if fn is not None else "it"
    msg = (f"`{q}`: an FFT path the NPU lacks ({why}); {where} runs as a CPU island (inputs to the host and the "
           "results back: a host sync per tensor argument, each call)") if obstacle is None else \
        (f"`{q}`: an FFT path the NPU lacks ({why}); not made a CPU island because {obstacle}")
    ctx.add(HAZARD, "complex-fft", call, msg, BLOCKS, HIGH, fixable=obstacle is None)


# --- fixes -------------------------------------------------------------------------------------

def _target_computes_complex(target: Target | None) -> bool:
    """The port's target is not an Ascend device (the CPU, whose kernels take complex dtypes): nothing to
    rewrite there."""
    from sandbox.targets import target_spec_of

    return target is not None and not target_spec_of(target).npu_like


class ComplexToReal(Rewriter):
    """Unit-magnitude polar tables -> their angle; view_as_real(x * f) -> real planes. With ``line`` (a run
    failed there on a complex kernel) only the innermost function holding that line, which becomes a CPU
    island when none of its math can be rewritten."""

    def __init__(self, module: cst.Module, line: int | None, reason: str) -> None:
        super().__init__()
        self.qual = _qualifier(module)
        self.line = line
        self.reason = reason
        self.scope: list[tuple[bool, int]] = []  # per enclosing function: (holds the line, edits before it)
        self.handled = False

    def _lines(self, node: cst.CSTNode) -> tuple[int, int]:
        r = self.get_metadata(PositionProvider, node)
        return r.start.line, r.end.line

    def _in_scope(self) -> bool:
        return self.line is None or (bool(self.scope) and self.scope[-1][0])

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if node.name.value.startswith("_npuport_"):
            return False
        start, end = self._lines(node)
        self.scope.append((self.line is not None and start <= self.line <= end, len(self.edits)))
        return True

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.BaseStatement:
        if original.name.value.startswith("_npuport_"):
            return updated
        holds, edits_before = self.scope.pop()
        if self.line is None or not holds or self.handled:
            return updated
        self.handled = True  # the innermost function holding the line is left first
        if len(self.edits) > edits_before or is_island(original):
            return updated
        why = island_obstacle(original)
        if why is not None:
            self.skip(original, f"the complex op at line {self.line} has no real rewrite and {why}")
            return updated
        self.note(original, f"`{original.name.value}` runs as a CPU island: {self.reason}; its tensor inputs go "
                            "to the host and its results come back (a host sync per tensor argument, each call)")
        return island(updated, self.reason)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not self._in_scope():
            return updated
        angle = unit_phase_angle(original, self.qual)
        if angle is not None:
            self.note(original, "torch.polar(torch.ones_like(a), a) -> _npuport_unit_phase(a): the complex table is "
                                "kept as its real angle (cos/sin at use), so no complex kernel runs")
            arg = updated.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return cst.Call(func=cst.Name("_npuport_unit_phase"), args=[arg])
        pair = product_operands(original, self.qual)
        if pair is not None:
            new_pair = product_operands(updated, self.qual) or pair
            self.note(original, "torch.view_as_real(x * f) -> _npuport_mul_as_real(x, f): the complex product on "
                                "real/imag planes")
            return cst.Call(func=cst.Name("_npuport_mul_as_real"),
                            args=[cst.Arg(_bare(new_pair[0])), cst.Arg(_bare(new_pair[1]))])
        return updated


def _bare(e: cst.BaseExpression) -> cst.BaseExpression:
    return e.with_changes(lpar=[], rpar=[]) if getattr(e, "lpar", None) else e


def island(fn: cst.FunctionDef, reason: str) -> cst.FunctionDef:
    """The function with the CPU-island decorator outermost."""
    deco = cst.Decorator(decorator=cst.parse_expression(f"_npuport_cpu_island({reason!r})"))
    return fn.with_changes(decorators=[deco, *fn.decorators])


def complex_to_real(source: str, *, line: int | None = None, target: Target | None = None,
                    reason: str = "", **_: Any) -> CodemodResult:
    if _target_computes_complex(target):
        return CodemodResult(source, False, skipped=["the target's CPU kernels take complex dtypes: nothing to "
                                                     "rewrite"])
    why = reason or "an NPU kernel rejected a complex dtype here"
    return run_codemod(source, lambda m: ComplexToReal(m, line, why),
                       [(PHASE_HELPERS, "class _NpuportUnitPhase("), (ISLAND_HELPERS, "def _npuport_cpu_island(")])


class FftIsland(Rewriter):
    """Functions that call a torch.fft function the NPU lacks (per the op matrix) run as CPU islands."""

    def __init__(self, module: cst.Module, target: Target | None) -> None:
        super().__init__()
        self.qual = _qualifier(module)
        self.target = target

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.BaseStatement:
        names = fft_calls(original, self.qual)
        if not names or original.name.value.startswith("_npuport_") or is_island(original):
            return updated
        on_npu, why = fft_verdict(names, self.target)
        if on_npu:
            self.skip(original, f"kept on the NPU: {why}")
            return updated
        obstacle = island_obstacle(original)
        if obstacle is not None:
            self.skip(original, f"an FFT path the NPU lacks ({why}), but {obstacle}")
            return updated
        self.note(original, f"`{original.name.value}` runs as a CPU island: {why}; its tensor inputs go to the host "
                            "and its results come back (a host sync per tensor argument, each call)")
        return island(updated, why)


def complex_cpu_island(source: str, *, target: Target | None = None, **_: Any) -> CodemodResult:
    if _target_computes_complex(target):
        return CodemodResult(source, False, skipped=["the target's CPU kernels take complex dtypes: no island"])
    return run_codemod(source, lambda m: FftIsland(m, target), [(ISLAND_HELPERS, "def _npuport_cpu_island(")])


# --- the run-time error it explains -----------------------------------------------------------------

def _npu_complex(exc: StructuredException, frame: Frame | None, where: str) -> Signature | None:
    found = _COMPLEX_DT.search(exc.message)
    if found is None:
        return None
    kernel = re.search(r"call (aclnn\w+) failed", exc.message)
    what = f"{kernel.group(1)} rejects {found.group(1)}" if kernel else f"an NPU kernel rejects {found.group(1)}"
    return Signature("npu-complex", f"npu-complex:{found.group(1)}@{where}", f"{what} at {where}", frame)


def _params(sig: Signature) -> dict[str, Any]:
    return {"line": sig.frame.line, "reason": sig.summary} if sig.frame else {}


RULE = HazardRule(
    hazard=HAZARD,
    title="complex tensors on the NPU path",
    detect=_h27_complex,
    fixes=(
        Fix("complex-to-real", complex_to_real, "compute complex tables and products in real arithmetic",
            frozenset({"complex-dtype"}), order=45),
        Fix("complex-cpu-island", complex_cpu_island, "run FFT paths the NPU lacks as explained CPU islands",
            frozenset({"complex-fft"}), order=46),
    ),
    explains=(ErrorPattern("npu-complex", _npu_complex, "complex tensors on the NPU", fix="complex-to-real",
                           params=_params, order=45),),
    kb_topic=f"recipe:{HAZARD}",
    left_as_written="a complex view or dtype with no kernel of its own; the op that fails on it is rewritten or "
                    "islanded when a run reaches it",
    fixtures=("tests/test_complex_npu.py",),
)
