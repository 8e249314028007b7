"""Static hazard scan (DESIGN §7, H1-H11) of a model's source tree with libcst.

One parse per file, one traversal that indexes the nodes the rules need (calls, dotted
references, strings, imports, loops, ...), then one function per hazard family reads that
index. Rule knowledge (which APIs, modules, ops) lives in the data tables below, written in
our own words. Every finding carries exact ``file:line:col`` evidence and a ``recipe:H<n>``
citation; the knowledge base adds more citations later.

A small intra-function dataflow (simple assignments only) backs the pattern rules: the
softmax(QK^T)V attention, the RMSNorm formula and the mixed-device ``torch.cat`` of H11.
"""

from __future__ import annotations

import ast
import dataclasses
import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from pydantic import BaseModel, Field

from agents.models import Citation, Finding, HazardCategory, Severity

BLOCKS = HazardCategory.BLOCKS_RUNNING
NUMBERS = HazardCategory.CHANGES_NUMBERS
SLOWS = HazardCategory.SLOWS_DOWN
HIGH, MEDIUM, LOW = Severity.HIGH, Severity.MEDIUM, Severity.LOW

HAZARD_TITLES: dict[str, str] = {
    "H1": "Hard-coded CUDA device and torch.cuda API",
    "H2": "CUDA autocast / AMP",
    "H3": "CUDA-only libraries and kernels",
    "H4": "Attention implementation and NPU fused-op opportunities",
    "H5": "dtypes Ascend handles differently (float64, complex, bf16 on 310P)",
    "H6": "Host syncs and Python loops in the hot path",
    "H7": "Ops that fall back to the CPU on Ascend",
    "H8": "Framework coupling (private APIs, exact pins, remote code)",
    "H9": "Distributed backend (nccl -> hccl)",
    "H10": "Serving knobs (vLLM CUDA-only settings, fork vs spawn)",
    "H11": "Latent bugs a new backend exposes",
}

# ----------------------------------------------------------------------------------------------
# Rule tables (data). Messages say what the code does and why it matters on Ascend.
# ----------------------------------------------------------------------------------------------

# H1: torch.cuda.<api> -> (severity, note). Anything else under torch.cuda gets the default note.
TORCH_CUDA_API: dict[str, tuple[Severity, str]] = {
    "is_available": (MEDIUM, "returns False on an Ascend host, so the code behind it silently takes its "
                             "non-GPU branch; ask torch.npu.is_available() instead"),
    "device_count": (MEDIUM, "is 0 on an Ascend host; use torch.npu.device_count()"),
    "get_device_name": (MEDIUM, "fails without CUDA; use torch.npu.get_device_name()"),
    "get_device_properties": (MEDIUM, "fails without CUDA; use torch.npu.get_device_properties()"),
    "get_device_capability": (MEDIUM, "asks for a CUDA compute capability, which an NPU does not have"),
    "synchronize": (HIGH, "raises without CUDA; use torch.npu.synchronize()"),
    "empty_cache": (LOW, "is a no-op without CUDA and frees nothing on the NPU; use torch.npu.empty_cache()"),
    "set_device": (HIGH, "raises without CUDA; use torch.npu.set_device()"),
    "current_device": (HIGH, "raises without CUDA; use torch.npu.current_device()"),
    "manual_seed": (LOW, "seeds only CUDA generators, so NPU random streams stay unseeded; "
                         "use torch.npu.manual_seed() or torch.manual_seed()"),
    "manual_seed_all": (LOW, "seeds only CUDA generators; use torch.npu.manual_seed_all()"),
    "Event": (HIGH, "CUDA events cannot time NPU work; use torch.npu.Event"),
    "Stream": (HIGH, "CUDA streams do not exist on the NPU; use torch.npu.Stream"),
    "stream": (HIGH, "CUDA stream context; use torch.npu.stream"),
    "current_stream": (HIGH, "CUDA stream query; use torch.npu.current_stream()"),
    "memory_allocated": (LOW, "reports CUDA memory only; use torch.npu.memory_allocated()"),
    "max_memory_allocated": (LOW, "reports CUDA memory only; use torch.npu.max_memory_allocated()"),
    "memory_reserved": (LOW, "reports CUDA memory only; use torch.npu.memory_reserved()"),
    "max_memory_reserved": (LOW, "reports CUDA memory only; use torch.npu.max_memory_reserved()"),
    "reset_peak_memory_stats": (LOW, "resets CUDA memory stats only; use torch.npu.reset_peak_memory_stats()"),
    "mem_get_info": (MEDIUM, "raises without CUDA; use torch.npu.mem_get_info()"),
    "memory_summary": (LOW, "reports CUDA memory only; use torch.npu.memory_summary()"),
    "graphs": (HIGH, "CUDA graphs do not exist on the NPU (torch.npu has its own graph capture)"),
    "CUDAGraph": (HIGH, "CUDA graphs do not exist on the NPU (torch.npu has its own graph capture)"),
    "FloatTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "HalfTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "LongTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
    "BoolTensor": (HIGH, "legacy CUDA tensor type; create the tensor with device= instead"),
}
TORCH_CUDA_DEFAULT = (HIGH, "needs a CUDA build and GPU; torch_npu offers the same call under torch.npu")

# H1: torch.backends.cudnn / torch.backends.cuda flags -> (category, note)
BACKEND_FLAGS: dict[str, tuple[HazardCategory, str]] = {
    "deterministic": (NUMBERS, "only makes cuDNN deterministic; NPU determinism is set with "
                               "torch.use_deterministic_algorithms() and torch_npu's own options"),
    "benchmark": (SLOWS, "tunes cuDNN kernels only; it does nothing on the NPU"),
    "allow_tf32": (NUMBERS, "TF32 is a CUDA matmul mode; the NPU's analogue is torch.npu.matmul.allow_hf32"),
    "enabled": (SLOWS, "switches cuDNN only; it does nothing on the NPU"),
    "sdp_kernel": (SLOWS, "selects CUDA SDPA kernels; it does not choose the NPU fused attention"),
}

# H3: CUDA-only modules -> (what it is, what to do on Ascend, codemod exists for a used import)
CUDA_ONLY_MODULES: dict[str, tuple[str, str, bool]] = {
    "flash_attn": ("FlashAttention CUDA kernels", "use torch SDPA or torch_npu.npu_fusion_attention", True),
    "flash_attn_2_cuda": ("FlashAttention-2 CUDA extension", "use torch SDPA or npu_fusion_attention", True),
    "flash_attn_interface": ("FlashAttention-3 (Hopper) kernels", "use torch SDPA or npu_fusion_attention", True),
    "flash_attn_cuda": ("FlashAttention-1 CUDA extension", "use torch SDPA or npu_fusion_attention", True),
    "xformers": ("xFormers CUDA kernels", "use torch SDPA or npu_fusion_attention", False),
    "apex": ("NVIDIA Apex fused CUDA ops", "use the plain torch modules (torch.nn.LayerNorm, torch.optim) "
             "or torch_npu fused ops", False),
    "bitsandbytes": ("bitsandbytes CUDA quantisation kernels", "load unquantised weights or use Ascend "
                     "quantisation (msModelSlim / npu_quant_matmul)", False),
    "triton": ("Triton GPU kernels", "rewrite with torch ops or torch_npu fused ops (triton-ascend is a "
               "separate port)", False),
    "deepspeed.ops": ("DeepSpeed CUDA ops", "use the torch implementation or DeepSpeed's NPU accelerator", False),
    "vllm.model_executor.layers.fused_moe": ("vLLM fused MoE CUDA/Triton kernels",
                                             "use vllm-ascend's MoE or torch_npu npu_moe_* / "
                                             "npu_grouped_matmul", False),
    "vllm._custom_ops": ("vLLM CUDA custom ops", "use vllm-ascend's ops", False),
    "vllm._C": ("vLLM compiled CUDA ops", "use vllm-ascend's ops", False),
    "vllm.vllm_flash_attn": ("vLLM's FlashAttention build", "use vllm-ascend's attention backend", False),
    "mamba_ssm": ("Mamba selective-scan CUDA kernels", "use a torch reference scan", False),
    "causal_conv1d": ("causal-conv1d CUDA kernel", "use torch.nn.functional.conv1d with left padding", False),
    "selective_scan_cuda": ("selective-scan CUDA extension", "use a torch reference scan", False),
    "fused_dense_lib": ("FlashAttention fused dense CUDA extension", "use torch.nn.Linear", False),
    "dropout_layer_norm": ("FlashAttention fused LayerNorm CUDA extension", "use torch.nn.LayerNorm "
                           "or npu_rms_norm", False),
    "rotary_emb": ("FlashAttention rotary CUDA extension", "use torch ops or npu_rotary_mul", False),
    "flashinfer": ("FlashInfer CUDA kernels", "use torch SDPA or npu_fused_infer_attention_score", False),
    "transformer_engine": ("NVIDIA Transformer Engine", "use plain torch modules", False),
    "liger_kernel": ("Liger Triton kernels", "use plain torch modules or torch_npu fused ops", False),
    "cupy": ("CuPy (CUDA arrays)", "use numpy or torch", False),
    "pycuda": ("PyCUDA", "use torch / torch_npu APIs", False),
    "pynvml": ("NVIDIA management library", "use torch.npu memory APIs or npu-smi", False),
    "numba.cuda": ("Numba CUDA kernels", "rewrite with torch ops", False),
    "sageattention": ("SageAttention CUDA kernels", "use torch SDPA or npu_fusion_attention", False),
    "grouped_gemm": ("grouped GEMM CUDA kernels", "use torch_npu.npu_grouped_matmul", False),
    "megablocks": ("MegaBlocks MoE CUDA kernels", "use torch_npu npu_moe_* ops", False),
    "flash_mla": ("FlashMLA CUDA kernels", "use torch_npu fused attention", False),
    "deep_gemm": ("DeepGEMM CUDA kernels", "use torch matmul or npu_grouped_matmul", False),
    "awq": ("AutoAWQ CUDA kernels", "load unquantised weights or Ascend quantisation", False),
    "auto_gptq": ("AutoGPTQ CUDA kernels", "load unquantised weights or Ascend quantisation", False),
    "exllamav2": ("ExLlamaV2 CUDA kernels", "load unquantised weights or Ascend quantisation", False),
}

# H3: requirement names (normalised) that pull CUDA-only packages.
CUDA_ONLY_REQUIREMENTS: frozenset[str] = frozenset({
    "flash-attn", "xformers", "triton", "bitsandbytes", "apex", "mamba-ssm", "causal-conv1d", "flashinfer",
    "flashinfer-python", "vllm-flash-attn", "transformer-engine", "liger-kernel", "pycuda", "pynvml",
    "auto-gptq", "autoawq", "exllamav2", "deep-gemm", "flash-mla", "grouped-gemm", "megablocks",
})
CUDA_EXTENSION_BUILD = {"torch.utils.cpp_extension.load", "torch.utils.cpp_extension.load_inline",
                        "torch.utils.cpp_extension.CUDAExtension", "torch.utils.cpp_extension.BuildExtension"}
TRITON_DECORATORS = {"triton.jit", "triton.autotune", "triton.heuristics"}

# H7: ops that commonly have no NPU kernel and run on the CPU (or AICPU). A static hint only:
# the op matrix of the chosen torch_npu and the emulator's run-time report are the truth.
FALLBACK_OPS: dict[str, str] = {
    "isneginf": "the functional form has no NPU kernel in common torch_npu builds",
    "isposinf": "the functional form has no NPU kernel in common torch_npu builds",
    "sinc": "the NPU kernel hands the work to the CPU",
    "cummax": "no NPU kernel", "cummin": "no NPU kernel", "logcumsumexp": "no NPU kernel",
    "lgamma": "no NPU kernel", "digamma": "no NPU kernel", "polygamma": "no NPU kernel",
    "mode": "no NPU kernel", "hypot": "no NPU kernel", "nextafter": "no NPU kernel",
    "heaviside": "no NPU kernel", "frexp": "no NPU kernel", "i0": "no NPU kernel",
    "igamma": "no NPU kernel", "igammac": "no NPU kernel",
    "linalg.eigh": "decompositions run on the CPU/AICPU", "linalg.eigvalsh": "decompositions run on the CPU/AICPU",
    "linalg.det": "decompositions run on the CPU/AICPU", "linalg.slogdet": "decompositions run on the CPU/AICPU",
    "linalg.inv": "decompositions run on the CPU/AICPU", "linalg.cholesky": "decompositions run on the CPU/AICPU",
    "linalg.lu_factor": "decompositions run on the CPU/AICPU",
}
FALLBACK_METHODS = {k for k in FALLBACK_OPS if "." not in k}

# H5
FLOAT64_REFS = {"torch.float64", "torch.double"}
NP_FLOAT64_REFS = {"numpy.float64", "numpy.double"}
COMPLEX_REFS = {"torch.complex64", "torch.complex128", "torch.complex32", "torch.cfloat", "torch.cdouble",
                "torch.chalf", "torch.view_as_complex", "torch.view_as_real", "torch.polar", "torch.complex"}

# H6: host-sync method calls -> (rule, note)
SYNC_METHODS: dict[str, tuple[str, str]] = {
    "item": ("item-sync", "`.item()` copies a value to the host and waits for every queued NPU op"),
    "tolist": ("tolist-sync", "`.tolist()` copies the tensor to the host and waits for the device"),
    "numpy": ("numpy-sync", "`.numpy()` needs a host tensor: the preceding `.cpu()` copies and waits for "
                            "the device"),
}
DYNAMIC_SHAPE_OPS = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive"}
HOT_FUNCTION_RE = re.compile(r"^(_?forward\w*|generate\w*|__call__|_?decode\w*|_?sample\w*|prefill\w*|step)$")

# H8
FRAMEWORK_INTERNAL_MODULES = {
    "transformers.utils.import_utils", "transformers.modeling_flash_attention_utils",
    "transformers.integrations.flash_attention", "transformers.integrations.flash_paged",
}
FLASH_AVAILABILITY_NAMES = {"is_flash_attn_2_available", "is_flash_attn_available",
                            "is_flash_attn_greater_or_equal_2_10", "is_flash_attn_greater_or_equal",
                            "is_flash_attn_3_available"}
FRAMEWORK_PACKAGES = {"torch", "torchvision", "torchaudio", "transformers", "vllm", "accelerate", "tokenizers",
                      "numpy", "safetensors", "deepspeed", "peft"}
PIN_RE = re.compile(r"(?<![\w.-])([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([A-Za-z0-9.+!*_-]+)")
REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
CUDA_WHEEL_RE = re.compile(r"\+cu\d+|/whl/cu\d+|cuda1\d[0-9x]*\b")

# H10
CUDA_GRAPH_KNOBS = {"cuda_graph_sizes", "cudagraph_capture_sizes", "max_seq_len_to_capture",
                    "max_context_len_to_capture", "cuda_graph_batch_sizes"}
CUDA_ATTENTION_BACKENDS = {"FLASH_ATTN", "FLASH_ATTN_VLLM_V1", "XFORMERS", "FLASHINFER", "TRITON_ATTN",
                           "TRITON_ATTN_VLLM_V1", "FLASHMLA", "CUTLASS_MLA"}

# Directories never scanned; files we read as text (not Python).
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "env", ".tox", ".nox", "node_modules",
             "site-packages", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", ".eggs"}
MAX_FILE_BYTES = 2_000_000
DEFAULT_INCLUDE = ["*.py", "requirements*.txt", "README*.md", "*.sh", "*.cu", "*.cuh"]

_WHITESPACE_NODES = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine,
                     cst.Newline, cst.Comment, cst.LeftParen, cst.RightParen, cst.Comma, cst.Dot)


# ----------------------------------------------------------------------------------------------
# Result records
# ----------------------------------------------------------------------------------------------

class ParseError(BaseModel):
    """A file the scan could not parse; reported, never raised."""

    file: str
    line: int
    col: int = 0
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class SkippedPath(BaseModel):
    path: str
    reason: str


class ScanResult(BaseModel):
    root: str
    findings: list[Finding] = Field(default_factory=list)  # sorted by (file, line, col)
    files: list[str] = Field(default_factory=list)  # files scanned (posix, relative to root)
    parse_errors: list[ParseError] = Field(default_factory=list)
    skipped: list[SkippedPath] = Field(default_factory=list)
    test_files: list[str] = Field(default_factory=list)  # scanned, but tests rather than model code

    def by_hazard(self) -> dict[str, list[Finding]]:
        out: dict[str, list[Finding]] = {}
        for f in self.findings:
            out.setdefault(f.hazard, []).append(f)
        return out

    def hazards(self) -> set[str]:
        return {f.hazard for f in self.findings}

    def model_findings(self) -> list[Finding]:
        """Findings outside test files."""
        tests = set(self.test_files)
        return [f for f in self.findings if f.file not in tests]


class SourceSyntaxError(ValueError):
    """scan_source on text that does not parse (scan_tree reports these as ParseError)."""

    def __init__(self, file: str, line: int, col: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.error = ParseError(file=file, line=line, col=col, message=message)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def scan_source(source: str, path: str) -> list[Finding]:
    """Findings for one Python source text; raises SourceSyntaxError when it does not parse."""
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        # CPython's own message and line are what the user knows; libcst's point past the error
        try:
            ast.parse(source, filename=path)
        except SyntaxError as py_exc:
            raise SourceSyntaxError(path, py_exc.lineno or exc.raw_line, max((py_exc.offset or 1) - 1, 0),
                                    py_exc.msg) from exc
        raise SourceSyntaxError(path, exc.raw_line, exc.raw_column,
                                f"libcst cannot parse this file: {exc.message}") from exc
    ctx = _Module(path, source, module)
    for family in FAMILIES:
        family(ctx)
    return ctx.sorted_findings()


def scan_tree(root: Path, *, include: list[str] | None = None) -> ScanResult:
    """Scan every Python (and requirements / README / shell) file under root.

    include: glob patterns matched against the posix path relative to root and against the
    file name; default: Python, requirements*.txt, README*.md, *.sh and CUDA sources.
    """
    root = Path(root)
    patterns = include or DEFAULT_INCLUDE
    result = ScanResult(root=str(root))
    findings: list[Finding] = []
    for path, rel in _walk(root, result.skipped):
        if not any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path.name, p) for p in patterns):
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            result.skipped.append(SkippedPath(path=rel, reason=f"larger than {MAX_FILE_BYTES} bytes"))
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            result.skipped.append(SkippedPath(path=rel, reason="not UTF-8 text"))
            continue
        result.files.append(rel)
        if _is_test_file(rel):
            result.test_files.append(rel)
        if path.suffix == ".py":
            try:
                findings.extend(scan_source(text, rel))
            except SourceSyntaxError as exc:
                result.parse_errors.append(exc.error)
            if path.name == "setup.py":
                findings.extend(_scan_setup_pins(text, rel))
        elif path.suffix in (".cu", ".cuh"):
            findings.append(_text_finding("H3", "cuda-source-file", rel, 1, 0, "",
                                          "CUDA C++ source: it compiles only with nvcc for NVIDIA GPUs; its "
                                          "kernels need a torch or Ascend C replacement", BLOCKS, HIGH, False))
        else:
            findings.extend(_scan_text_file(text, rel, path.name))
    result.findings = _dedupe_sorted(findings)
    return result


def _walk(root: Path, skipped: list[SkippedPath]) -> Iterator[tuple[Path, str]]:
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = sorted(d.iterdir())
        except OSError as exc:
            skipped.append(SkippedPath(path=d.relative_to(root).as_posix() or ".", reason=str(exc)))
            continue
        for p in entries:
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                skipped.append(SkippedPath(path=rel, reason="symbolic link"))
            elif p.is_dir():
                if p.name in SKIP_DIRS or p.name.endswith(".egg-info"):
                    skipped.append(SkippedPath(path=rel, reason="tool or cache directory"))
                elif (p / "pyvenv.cfg").exists():
                    skipped.append(SkippedPath(path=rel, reason="virtual environment"))
                else:
                    stack.append(p)
            elif p.is_file():
                yield p, rel
        stack.sort(reverse=True)  # walk in name order, so results are stable


def _is_test_file(rel: str) -> bool:
    parts = rel.split("/")
    name = parts[-1]
    return (any(p in ("tests", "test") for p in parts[:-1]) or name.startswith("test_")
            or name.endswith("_test.py") or name == "conftest.py")


def _dedupe_sorted(findings: Iterable[Finding]) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for f in findings:
        seen.setdefault(f.id, f)
    return sorted(seen.values(), key=lambda f: (f.file, f.line, f.col, int(f.hazard[1:]), f.rule))


def _make_finding(hazard: str, rule: str, file: str, line: int, col: int, snippet: str, message: str,
                  category: HazardCategory, severity: Severity, fixable: bool) -> Finding:
    return Finding(id=f"{hazard}-{rule}-{file}:{line}", hazard=hazard, rule=rule, file=file, line=line, col=col,
                   snippet=snippet, message=message, category=category, severity=severity, fixable=fixable,
                   citations=[Citation(source=f"recipe:{hazard}", title=HAZARD_TITLES[hazard])])


def _text_finding(hazard: str, rule: str, file: str, line: int, col: int, snippet: str, message: str,
                  category: HazardCategory, severity: Severity, fixable: bool) -> Finding:
    return _make_finding(hazard, rule, file, line, col, snippet, message, category, severity, fixable)


# ----------------------------------------------------------------------------------------------
# Per-module index
# ----------------------------------------------------------------------------------------------

@dataclass
class _Ref:
    """The outermost Name/Attribute of a dotted chain, with its import-resolved name."""

    node: cst.Name | cst.Attribute
    qual: str


@dataclass
class _Module:
    path: str
    source: str
    module: cst.Module
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.positions = _positions(self.module)
        self.lines = self.source.splitlines()
        self.ix = _Indexer(self.module)
        self.aliases = _aliases(self.ix.imports)
        self.refs = [_Ref(n, self.qualify(_dotted(n) or "")) for n in self.ix.chains]
        self._flow: _Flow | None = None
        self._fallback_devices: list[cst.CSTNode] | None = None
        self._hot: set[str] | None = None

    # --- names --------------------------------------------------------------------------------
    def qualify(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return dotted
        return f"{full}.{rest}" if rest else full

    def qual(self, node: cst.CSTNode) -> str:
        d = _dotted(node)
        return self.qualify(d) if d else ""

    def is_module_ref(self, node: cst.CSTNode) -> bool:
        """True when node is (a dotted path under) an imported name: `torch`, `F`, `np.linalg`."""
        d = _dotted(node)
        return d is not None and d.partition(".")[0] in self.aliases

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.ix.parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[tuple[cst.CSTNode, cst.CSTNode]]:
        """(ancestor, child-on-the-path) pairs, innermost first."""
        child = node
        p = self.parent(node)
        while p is not None:
            yield p, child
            child, p = p, self.parent(p)

    def function_of(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        for a, _ in self.ancestors(node):
            if isinstance(a, cst.FunctionDef):
                return a
        return None

    def in_hot_path(self, node: cst.CSTNode) -> str | None:
        """Name of the enclosing function when it runs per forward step: forward/generate-like, or
        called (by name, within this file) from one."""
        if self._hot is None:
            self._hot = _hot_functions(self)
        fn = self.function_of(node)
        while fn is not None:
            if fn.name.value in self._hot:
                return fn.name.value
            fn = self.function_of(fn)
        return None

    # --- findings -----------------------------------------------------------------------------
    def pos(self, node: cst.CSTNode) -> tuple[int, int]:
        r: CodeRange = self.positions[node]
        return r.start.line, r.start.column

    def add(self, hazard: str, rule: str, node: cst.CSTNode, message: str, category: HazardCategory,
            severity: Severity, fixable: bool = True) -> None:
        line, col = self.pos(node)
        snippet = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(_make_finding(hazard, rule, self.path, line, col, snippet, message, category,
                                           severity, fixable))

    def sorted_findings(self) -> list[Finding]:
        return _dedupe_sorted(self.findings)

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    # --- shared analyses ----------------------------------------------------------------------
    @property
    def flow(self) -> _Flow:
        if self._flow is None:
            self._flow = _Flow(self)
            self._flow.run()
        return self._flow

    @property
    def fallback_devices(self) -> list[cst.CSTNode]:
        """If / IfExp nodes of the idiom `"cuda" if torch.cuda.is_available() else "cpu"`."""
        if self._fallback_devices is None:
            self._fallback_devices = _find_device_fallbacks(self)
        return self._fallback_devices


def _positions(module: cst.Module) -> Mapping[cst.CSTNode, CodeRange]:
    """PositionProvider metadata for every node of module.

    MetadataWrapper.resolve also runs an (empty) batched visitor over the whole tree, which
    doubles the cost on a large model; the provider's own pass is all PositionProvider needs.
    """
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    gen = getattr(PositionProvider(), "_gen", None)
    if gen is not None:
        try:
            return cast(Mapping[cst.CSTNode, CodeRange], gen(wrapper))
        except TypeError:  # a libcst whose internals changed: take the public road
            pass
    return wrapper.resolve(PositionProvider)


class _Indexer:
    """One walk over the tree: parents plus the node lists the rules read.

    Walks dataclass fields directly rather than through libcst's visitor machinery, which
    rebuilds every node and costs several times more on a 2,000-line model.
    """

    def __init__(self, module: cst.Module) -> None:
        self.parents: dict[cst.CSTNode, cst.CSTNode] = {}
        self.calls: list[cst.Call] = []
        self.chains: list[cst.Name | cst.Attribute] = []  # outermost dotted chains (not in imports)
        self.load_names: Counter[str] = Counter()  # names used (not bound by import/def/param/keyword)
        self.strings: list[cst.SimpleString | cst.FormattedString] = []
        self.imports: list[cst.Import | cst.ImportFrom] = []
        self.fors: list[cst.For] = []
        self.functions: list[cst.FunctionDef] = []
        self.args: list[cst.Arg] = []  # keyword arguments
        self.statements: list[cst.CSTNode] = []  # small statements, for the dataflow
        self._walk(module)

    def _walk(self, root: cst.CSTNode) -> None:
        stack = [root]
        parents = self.parents
        while stack:
            node = stack.pop()
            if self._index(node):
                kids = _children(node)
                for c in kids:
                    parents[c] = node
                stack.extend(reversed(kids))

    def _index(self, node: cst.CSTNode) -> bool:
        """Record node; False when its children need no walk."""
        if isinstance(node, cst.Import | cst.ImportFrom):
            self.imports.append(node)
            return False  # names in imports are bindings, read from the import node itself
        if isinstance(node, cst.Call):
            self.calls.append(node)
        elif isinstance(node, cst.Name | cst.Attribute):
            self._index_name(node)
        elif isinstance(node, cst.SimpleString | cst.FormattedString):
            self.strings.append(node)
        elif isinstance(node, cst.For):
            self.fors.append(node)
        elif isinstance(node, cst.FunctionDef):
            self.functions.append(node)
        elif isinstance(node, cst.Arg):
            if node.keyword is not None:
                self.args.append(node)
        elif isinstance(node, cst.Assign | cst.AugAssign | cst.AnnAssign | cst.Expr | cst.Return):
            self.statements.append(node)
        return True

    def _index_name(self, node: cst.Name | cst.Attribute) -> None:
        parent = self.parents.get(node)
        if isinstance(parent, cst.Attribute) and (parent.attr is node or parent.value is node):
            return  # part of a longer chain, indexed with it
        if isinstance(node, cst.Name):
            if isinstance(parent, cst.Arg) and parent.keyword is node:
                return
            if isinstance(parent, cst.Param | cst.FunctionDef | cst.ClassDef) and parent.name is node:
                return
        if _dotted(node) is None:
            return  # e.g. `x().y`: not a plain dotted chain
        self.chains.append(node)
        self.load_names[_root_name(node)] += 1


_FIELDS: dict[type, tuple[str, ...]] = {}


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Child nodes in field order, without whitespace/comment nodes."""
    t = type(node)
    names = _FIELDS.get(t)
    if names is None:
        names = _FIELDS[t] = tuple(f.name for f in dataclasses.fields(t))  # type: ignore[arg-type]
    out: list[cst.CSTNode] = []
    for name in names:
        v = getattr(node, name)
        if isinstance(v, cst.CSTNode):
            if not isinstance(v, _WHITESPACE_NODES):
                out.append(v)
        elif isinstance(v, tuple | list):
            out.extend(c for c in v if isinstance(c, cst.CSTNode) and not isinstance(c, _WHITESPACE_NODES))
    return out


def _hot_functions(ctx: _Module) -> set[str]:
    """Names of forward/generate-like functions and of the functions they call (transitively)."""
    callees: dict[str, set[str]] = {}
    for call in ctx.ix.calls:
        fn = ctx.function_of(call)
        f = call.func
        if fn is None:
            continue
        if isinstance(f, cst.Name) or (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name)
                                       and f.value.value in ("self", "cls")):
            callees.setdefault(fn.name.value, set()).add(_last_name(f))
    hot = {fn.name.value for fn in ctx.ix.functions if HOT_FUNCTION_RE.match(fn.name.value)}
    todo = list(hot)
    while todo:
        for callee in callees.get(todo.pop(), ()):
            if callee not in hot:
                hot.add(callee)
                todo.append(callee)
    return hot


def _dotted(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _root_name(node: cst.CSTNode) -> str:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else ""


def _last_name(func: cst.CSTNode) -> str:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return ""


def _aliases(imports: Sequence[cst.Import | cst.ImportFrom]) -> dict[str, str]:
    """Local name -> full dotted name, from the module's imports (relative ones keep their dots)."""
    out: dict[str, str] = {}
    for imp in imports:
        if isinstance(imp, cst.Import):
            for a in imp.names:
                full = _dotted(a.name) or ""
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    out[a.asname.name.value] = full
                else:
                    head = full.partition(".")[0]
                    out.setdefault(head, head)
        elif not isinstance(imp.names, cst.ImportStar):
            base = "." * len(imp.relative) + (_dotted(imp.module) or "" if imp.module else "")
            for a in imp.names:
                name = _dotted(a.name) or ""
                local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else name
                out[local] = f"{base}.{name}" if base and not base.endswith(".") else f"{base}{name}"
    return out


def _import_module_names(imp: cst.Import | cst.ImportFrom) -> list[tuple[str, list[str]]]:
    """(module, local names it binds) per imported module."""
    if isinstance(imp, cst.Import):
        out = []
        for a in imp.names:
            full = _dotted(a.name) or ""
            local = a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else full.split(".")[0]
            out.append((full, [local]))
        return out
    if imp.relative or imp.module is None:
        return []
    mod = _dotted(imp.module) or ""
    if isinstance(imp.names, cst.ImportStar):
        return [(mod, [])]
    locals_ = [a.asname.name.value if a.asname and isinstance(a.asname.name, cst.Name) else _dotted(a.name) or ""
               for a in imp.names]
    # `from vllm.model_executor.layers import fused_moe` imports the module itself
    return [(mod, locals_)] + [(f"{mod}.{_dotted(a.name)}", [loc]) for a, loc in zip(imp.names, locals_,
                                                                                     strict=True)]


def _match_prefix(name: str, table: Iterable[str]) -> str | None:
    for key in table:
        if name == key or name.startswith(key + "."):
            return key
    return None


def _string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        v = node.evaluated_value
        return v if isinstance(v, str) else None
    if isinstance(node, cst.FormattedString):
        # the leading literal text is enough to recognise f"cuda:{rank}"
        text = "".join(p.value for p in node.parts if isinstance(p, cst.FormattedStringText))
        first = node.parts[0] if node.parts else None
        return text if isinstance(first, cst.FormattedStringText) else None
    return None


def _is_cuda_device_string(value: str | None) -> bool:
    return value is not None and (value == "cuda" or value.startswith("cuda:"))


def _kwarg(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _positional(call: cst.Call, i: int) -> cst.BaseExpression | None:
    pos = [a for a in call.args if a.keyword is None and not a.star]
    return pos[i].value if len(pos) > i else None


def _walk_nodes(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for c in _children(node):
        yield from _walk_nodes(c)


# ----------------------------------------------------------------------------------------------
# H1 hard-coded CUDA
# ----------------------------------------------------------------------------------------------

def _h1_cuda_device(ctx: _Module) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "cuda" and not ctx.is_module_ref(f.value):
            ctx.add("H1", "cuda-call", call,
                    "`.cuda()` moves the tensor/module to a CUDA GPU: without CUDA it raises \"Torch not compiled "
                    "with CUDA enabled\"; move to the run's device (`.to(device)`, `npu` on Ascend)", BLOCKS, HIGH)
    for s in ctx.ix.strings:
        value = _string_value(s)
        if _is_cuda_device_string(value):
            _h1_cuda_string(ctx, s, value or "")
        elif value == "CUDA_VISIBLE_DEVICES":
            ctx.add("H1", "cuda-visible-devices", s,
                    "CUDA_VISIBLE_DEVICES selects GPUs only; Ascend reads ASCEND_RT_VISIBLE_DEVICES, so device "
                    "selection silently stops working", BLOCKS, MEDIUM)
    for ref in ctx.refs:
        q = ref.qual
        if q == "torch.cuda" or (q.startswith("torch.cuda.") and not q.startswith(("torch.cuda.amp",
                                                                                    "torch.cuda.nccl"))):
            api = q.split(".")[2] if q.count(".") >= 2 else ""
            sev, note = TORCH_CUDA_API.get(api, TORCH_CUDA_DEFAULT)
            ctx.add("H1", "torch-cuda-api", ref.node, f"`{q}` {note}", BLOCKS, sev)
        elif q.startswith(("torch.backends.cudnn.", "torch.backends.cuda.")):
            flag = next((p for p in reversed(q.split(".")) if p in BACKEND_FLAGS), "")
            cat, note = BACKEND_FLAGS.get(flag, (SLOWS, "configures CUDA/cuDNN only; it does nothing on the NPU"))
            rule = "cudnn-flags" if ".cudnn." in q else "cuda-backend-flags"
            ctx.add("H1", rule, ref.node, f"`{q}` {note}", cat, LOW)


def _h1_cuda_string(ctx: _Module, s: cst.CSTNode, value: str) -> None:
    where = _device_string_context(ctx, s)
    if where == "compare":
        ctx.add("H1", "cuda-device-check", s,
                f"compares a device (type) with \"{value}\": on Ascend the type is \"npu\", so this branch is "
                "never taken there", NUMBERS, MEDIUM)
    elif where is not None:
        ctx.add("H1", "cuda-device-string", s,
                f"device \"{value}\" ({where}) is hard-coded: without CUDA it raises; use the run's device "
                "(\"npu\" on Ascend)", BLOCKS, HIGH)


def _device_string_context(ctx: _Module, s: cst.CSTNode) -> str | None:
    """Where a "cuda" string is used as a device, or None when it is just text."""
    for a, _ in ctx.ancestors(s):
        if isinstance(a, cst.IfExp | cst.BooleanOperation):
            continue  # `"cuda" if ok else "cpu"`: look at what the whole expression feeds
        if isinstance(a, cst.Arg):
            if a.keyword is not None:
                kw = a.keyword.value
                return f"{kw}=" if kw in ("device", "map_location", "device_map") or kw.endswith("_device") \
                    else None
            call = ctx.parent(a)
            if isinstance(call, cst.Call):
                if ctx.qual(call.func) == "torch.device":
                    return "torch.device(...)"
                if _last_name(call.func) in ("to", "set_default_device"):
                    return f".{_last_name(call.func)}(...)"
            return None
        if isinstance(a, cst.Param):
            return "parameter default" if "device" in a.name.value else None
        if isinstance(a, cst.Assign | cst.AnnAssign):
            targets = [t.target for t in a.targets] if isinstance(a, cst.Assign) else [a.target]
            names = " ".join(_dotted(t) or "" for t in targets)
            return "assigned to a device variable" if "device" in names.lower() else None
        if isinstance(a, cst.Comparison | cst.ComparisonTarget):
            return "compare"
        return None
    return None


# ----------------------------------------------------------------------------------------------
# H2 CUDA autocast / AMP
# ----------------------------------------------------------------------------------------------

def _h2_autocast(ctx: _Module) -> None:
    for ref in ctx.refs:
        q = ref.qual
        if q.startswith("torch.cuda.amp"):
            last = q.rsplit(".", 1)[-1]
            if last == "autocast":
                ctx.add("H2", "cuda-autocast", ref.node,
                        "`torch.cuda.amp.autocast` without CUDA turns itself off with a warning, so the model "
                        "silently runs in float32 (other numbers, slower); use torch.autocast(\"npu\", ...) or "
                        "torch.npu.amp.autocast", NUMBERS, HIGH)
            elif last == "GradScaler":
                ctx.add("H2", "cuda-grad-scaler", ref.node,
                        "`torch.cuda.amp.GradScaler` is CUDA-only; use torch.npu.amp.GradScaler", BLOCKS, MEDIUM)
            else:
                ctx.add("H2", "cuda-amp", ref.node,
                        f"`{q}` is CUDA AMP; torch_npu has the same under torch.npu.amp", BLOCKS, MEDIUM)
        elif q in ("torch.get_autocast_gpu_dtype", "torch.set_autocast_gpu_dtype", "torch.is_autocast_enabled",
                   "torch.set_autocast_enabled"):
            call = ctx.parent(ref.node)
            nargs = len(call.args) if isinstance(call, cst.Call) and call.func is ref.node else -1
            gpu_form = "gpu" in q or (q.endswith("is_autocast_enabled") and nargs == 0) or (
                q.endswith("set_autocast_enabled") and nargs == 1)
            if gpu_form:
                ctx.add("H2", "autocast-gpu-state", ref.node,
                        f"`{q.removeprefix('torch.')}` reads/sets the CUDA autocast state, not the NPU's: under "
                        "NPU autocast it reports the wrong dtype/flag; pass the device: "
                        "torch.get_autocast_dtype(\"npu\") / torch.is_autocast_enabled(\"npu\")", NUMBERS, MEDIUM)
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if q in ("torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler", "torch.amp.autocast_mode.autocast"):
            dev = _kwarg(call, "device_type") or _kwarg(call, "device")
            value = _string_value(dev.value) if dev else _string_value(_positional(call, 0) or cst.Name("x"))
            if value == "cuda":
                rule = "cuda-grad-scaler" if q.endswith("GradScaler") else "cuda-autocast"
                ctx.add("H2", rule, call,
                        f"`{q}` with device \"cuda\": without CUDA it is disabled with a warning, so the model "
                        "silently runs in full precision; use device \"npu\"", NUMBERS, HIGH)


# ----------------------------------------------------------------------------------------------
# H3 CUDA-only libraries
# ----------------------------------------------------------------------------------------------

@dataclass
class _CudaImport:
    node: cst.Import | cst.ImportFrom
    module: str
    key: str
    names: list[str]


def _cuda_imports(ctx: _Module) -> list[_CudaImport]:
    out = []
    for imp in ctx.ix.imports:
        for mod, names in _import_module_names(imp):
            key = _match_prefix(mod, CUDA_ONLY_MODULES)
            if key is not None:
                out.append(_CudaImport(imp, mod, key, names))
                break  # one finding per import statement
    return out


def _import_guard(ctx: _Module, node: cst.CSTNode) -> str | None:
    """'try/except ImportError' or 'if <availability check>' when the import is guarded."""
    for a, child in ctx.ancestors(node):
        if isinstance(a, cst.Try | cst.TryStar) and child is a.body:
            for h in a.handlers:
                caught = ctx.code(h.type) if h.type is not None else "everything"
                if h.type is None or re.search(r"ImportError|ModuleNotFoundError|Exception", caught):
                    return "try/except ImportError"
        if isinstance(a, cst.If) and child is not a.test:
            test = ctx.code(a.test)
            if re.search(r"is_\w+_available|find_spec|HAS_\w+|_AVAILABLE\b", test):
                return f"if {test.strip()}"
    return None


def _h3_cuda_libraries(ctx: _Module) -> None:
    imports = _cuda_imports(ctx)
    bound: set[str] = set()
    for ci in imports:
        what, todo, fix_used = CUDA_ONLY_MODULES[ci.key]
        bound.update(n for n in ci.names if n)
        used = any(ctx.ix.load_names.get(n, 0) > 0 for n in ci.names if n)
        guard = _import_guard(ctx, ci.node)
        if guard is not None:
            ctx.add("H3", "cuda-only-import-guarded", ci.node,
                    f"`{ci.module}` ({what}) is imported behind {guard}: it loads nothing on Ascend; check the "
                    f"fallback it takes is efficient ({todo})", SLOWS, LOW, False)
        elif not used:
            ctx.add("H3", "unused-cuda-only-import", ci.node,
                    f"`{ci.module}` ({what}) is imported but never used: the import alone fails on Ascend where "
                    "the package cannot be installed; remove it", BLOCKS, HIGH, True)
        else:
            ctx.add("H3", "cuda-only-import", ci.node,
                    f"`{ci.module}` ({what}) is imported and used: it cannot be installed on Ascend; guard the "
                    f"import and give its call sites a fallback ({todo})", BLOCKS, HIGH, fix_used)
            unused = [n for n in ci.names if n and not ctx.ix.load_names.get(n, 0)]
            if unused:
                ctx.add("H3", "unused-cuda-only-import", ci.node,
                        f"{', '.join(unused)} from `{ci.module}` never used: drop {'it' if len(unused) == 1 else 'them'}"
                        " from the import", BLOCKS, HIGH, True)
    _h3_optional_paths(ctx, bound)
    for fn in ctx.ix.functions:
        for d in fn.decorators:
            target = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
            if ctx.qual(target) in TRITON_DECORATORS:
                ctx.add("H3", "triton-kernel", d,
                        f"`{fn.name.value}` is a Triton kernel: it is compiled for CUDA GPUs; rewrite it with torch "
                        "ops or a torch_npu fused op (triton-ascend is a separate port)", BLOCKS, HIGH, False)
                break
    for ref in ctx.refs:
        if ref.qual in CUDA_EXTENSION_BUILD:
            ctx.add("H3", "cuda-extension-build", ref.node,
                    f"`{ref.qual.rsplit('.', 1)[-1]}` builds a custom C++/CUDA extension: it needs nvcc and a "
                    "GPU; its kernels need a torch or Ascend C replacement", BLOCKS, HIGH, False)


def _h3_optional_paths(ctx: _Module, bound: set[str]) -> None:
    """`if cfg.use_flash_attn: flash_attn_func(...)`: the CUDA call sits behind a flag."""
    if not bound:
        return
    for call in ctx.ix.calls:
        if _root_name(call.func) not in bound:
            continue
        for a, child in ctx.ancestors(call):
            if isinstance(a, cst.FunctionDef | cst.ClassDef | cst.Module):
                break
            if isinstance(a, cst.If | cst.IfExp) and child is not a.test:
                ctx.add("H3", "optional-fused-path", a,
                        f"optional fused path: `{ctx.code(a.test).strip()}` selects a CUDA-only call "
                        f"(`{_dotted(call.func)}`); on Ascend the flag must be off, or the branch must call an "
                        "NPU fused op instead", BLOCKS, MEDIUM, True)
                break


# ----------------------------------------------------------------------------------------------
# H4 attention implementation and fused-op opportunities
# ----------------------------------------------------------------------------------------------

def _h4_attention(ctx: _Module) -> None:
    impl_nodes: list[cst.CSTNode] = []
    strings = {(_string_value(s) or "") for s in ctx.ix.strings}
    for s in ctx.ix.strings:
        value = _string_value(s)
        if value not in ("flash_attention_2", "flash_attention_3"):
            continue
        impl_nodes.append(s)
        parent = ctx.parent(s)
        if isinstance(parent, cst.ComparisonTarget | cst.Comparison):
            ctx.add("H4", "flash-attention-2-branch", s,
                    f"code path taken only with attn_implementation \"{value}\": it is dead on Ascend, where the "
                    "model takes its other attention branch; check that branch is efficient", SLOWS, LOW, False)
        elif isinstance(parent, cst.DictElement) and parent.key is s:
            ctx.add("H4", "flash-attention-2-impl", s,
                    f"attention table entry \"{value}\" maps to a FlashAttention class that needs CUDA", BLOCKS,
                    MEDIUM, False)
        else:
            ctx.add("H4", "flash-attention-2-impl", s,
                    f"selects attn_implementation \"{value}\": it imports flash_attn and fails on Ascend; use "
                    "\"sdpa\" (or \"eager\")", BLOCKS, HIGH)
    chooses_impl = impl_nodes or any(r.qual.endswith("_attn_implementation") for r in ctx.refs)
    # a registry lookup (transformers' ALL_ATTENTION_FUNCTIONS) includes sdpa
    uses_sdpa = "sdpa" in strings or any(r.qual.endswith(("scaled_dot_product_attention", "ALL_ATTENTION_FUNCTIONS"))
                                         for r in ctx.refs)
    if chooses_impl and not uses_sdpa:
        first = impl_nodes[0] if impl_nodes else next(r.node for r in ctx.refs
                                                      if r.qual.endswith("_attn_implementation"))
        ctx.add("H4", "sdpa-missing", first,
                "the model chooses an attention implementation but has no SDPA path: on Ascend it falls back to "
                "eager attention (slow); an SDPA or npu_fusion_attention path keeps it fused", SLOWS, MEDIUM, False)
    for ref in ctx.refs:
        if ref.qual.endswith("scaled_dot_product_attention") and isinstance(ctx.parent(ref.node), cst.Call):
            ctx.add("H4", "sdpa-used", ref.node,
                    "SDPA runs on Ascend; torch_npu uses its fused kernel only for some masks, dtypes and head "
                    "sizes, so check the op report (npu_fusion_attention gives full control)", SLOWS, LOW, False)
    for site, bias in ctx.flow.attention_sites:
        extra = ("with an additive bias: npu_prompt_flash_attention takes it as pse_shift, or "
                 "npu_fusion_attention as pse" if bias == "bias" else
                 "with a mask: npu_fusion_attention takes it as atten_mask" if bias == "mask" else
                 "npu_fusion_attention / npu_prompt_flash_attention do it in one kernel")
        ctx.add("H4", "fused-attention-opportunity", site,
                f"hand-written attention softmax(QK^T)V {extra}; one fused kernel instead of several ops and a "
                "materialised score matrix", SLOWS, LOW, False)
    for site in ctx.flow.rms_sites:
        ctx.add("H4", "rms-norm-opportunity", site,
                "hand-written RMSNorm (x * rsqrt(mean(x^2) + eps)): torch_npu.npu_rms_norm does it in one kernel",
                SLOWS, LOW, False)
    _h4_rotary(ctx)


def _h4_rotary(ctx: _Module) -> None:
    seen_fns: set[cst.CSTNode | None] = set()
    for call in ctx.ix.calls:
        if _last_name(call.func) == "rotate_half":
            fn = ctx.function_of(call)
            if fn not in seen_fns:
                seen_fns.add(fn)
                ctx.add("H4", "rotary-opportunity", call,
                        "rotary embedding via rotate_half (x*cos + rotate_half(x)*sin): torch_npu.npu_rotary_mul "
                        "does it in one kernel", SLOWS, LOW, False)


# ----------------------------------------------------------------------------------------------
# H5 dtypes
# ----------------------------------------------------------------------------------------------

def _h5_dtypes(ctx: _Module) -> None:
    for ref in ctx.refs:
        q = ref.qual
        if q in FLOAT64_REFS:
            ctx.add("H5", "float64", ref.node,
                    f"`{q}`: the NPU has no float64 compute; casts silently become float32 and some kernels "
                    "reject double, so numbers differ from the reference or the op fails; use float32",
                    NUMBERS, MEDIUM)
        elif q in NP_FLOAT64_REFS and _feeds_torch(ctx, ref.node):
            ctx.add("H5", "float64", ref.node,
                    "numpy float64 flowing into a torch tensor makes it float64, which the NPU does not compute "
                    "(silently float32 or rejected); use float32", NUMBERS, MEDIUM)
        elif q in COMPLEX_REFS:
            ctx.add("H5", "complex-dtype", ref.node,
                    f"`{q}`: complex tensors are unsupported by most Ascend kernels (complex128 runs on AICPU, "
                    "slowly); rewrite with real cos/sin pairs (e.g. npu_rotary_mul for rotary embeddings)",
                    BLOCKS, HIGH, False)
        elif q == "torch.bfloat16":
            ctx.add("H5", "bf16-on-310p", ref.node,
                    "bfloat16 is fine on Atlas A2/A3 (910B/910C) but Atlas 300I (310P) has no bfloat16: use "
                    "float16 there", BLOCKS, LOW)
    for call in ctx.ix.calls:
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "double" and not call.args \
                and not ctx.is_module_ref(f.value):
            ctx.add("H5", "float64", call,
                    "`.double()` makes a float64 tensor: the NPU has no float64 compute (silently float32 or "
                    "rejected); use .float()", NUMBERS, MEDIUM)
        dt = _kwarg(call, "dtype")
        if dt is not None and isinstance(dt.value, cst.Name) and dt.value.value in ("float", "complex") \
                and ctx.qual(f).startswith("torch."):
            ctx.add("H5", "float64" if dt.value.value == "float" else "complex-dtype", dt,
                    f"dtype={dt.value.value} means {'float64' if dt.value.value == 'float' else 'complex128'} "
                    "in torch, which Ascend does not compute natively", NUMBERS, MEDIUM)


def _feeds_torch(ctx: _Module, node: cst.CSTNode) -> bool:
    """The numpy dtype sits in a statement that also builds a torch tensor."""
    for a, _ in ctx.ancestors(node):
        if isinstance(a, cst.SimpleStatementLine | cst.BaseCompoundStatement):
            return bool(re.search(r"\btorch\.(from_numpy|tensor|as_tensor)|\bfrom_numpy\(", ctx.code(a)))
    return False


# ----------------------------------------------------------------------------------------------
# H6 host syncs and Python loops
# ----------------------------------------------------------------------------------------------

def _h6_host_sync(ctx: _Module) -> None:
    for call in ctx.ix.calls:
        f = call.func
        if not isinstance(f, cst.Attribute) or ctx.is_module_ref(f.value):
            q = ctx.qual(f)
            if q in ("torch.nonzero", "torch.argwhere", "torch.masked_select", "torch.unique") or (
                    q == "torch.where" and len(call.args) == 1):
                _h6_dynamic(ctx, call, q)
            continue
        name = f.attr.value
        hot = ctx.in_hot_path(call)
        where = f" in {hot}()" if hot else ""
        if name in SYNC_METHODS and not call.args:
            rule, note = SYNC_METHODS[name]
            ctx.add("H6", rule, call, f"{note}{where}; on Ascend each sync stalls the NPU pipeline"
                    + (" at every step" if hot else ""), SLOWS, MEDIUM if hot else LOW, False)
        elif name in DYNAMIC_SHAPE_OPS:
            _h6_dynamic(ctx, call, f".{name}()")
    for loop in ctx.ix.fors:
        _h6_loop(ctx, loop)


def _h6_dynamic(ctx: _Module, call: cst.Call, what: str) -> None:
    hot = ctx.in_hot_path(call)
    ctx.add("H6", "dynamic-shape-sync", call,
            f"`{what}` has a data-dependent output size: the host waits for the device to learn it"
            + (f" (in {hot}())" if hot else "") + "; on Ascend it also forces shape recompilation",
            SLOWS, MEDIUM if hot else LOW, False)


def _range_loop_vars(loop: cst.For) -> set[str]:
    it = loop.iter
    if isinstance(it, cst.Call) and _last_name(it.func) in ("range", "enumerate", "zip"):
        return {n.value for n in _walk_nodes(loop.target) if isinstance(n, cst.Name)}
    return set()


def _h6_loop(ctx: _Module, loop: cst.For) -> None:
    hot = ctx.in_hot_path(loop)
    where = f" in {hot}()" if hot else ""
    iter_code = ctx.code(loop.iter)
    if "expert" in iter_code.lower():
        ctx.add("H6", "per-expert-loop", loop,
                f"Python loop over experts{where}: one small matmul (and often a nonzero/where sync) per expert; "
                "on Ascend group them with npu_moe_init_routing + npu_grouped_matmul", SLOWS,
                HIGH if hot else MEDIUM, False)
        return
    if not _range_loop_vars(loop):
        return
    # element-wise tensor building: `t[i, j] = ...` indexed by this loop's variables (or outer ones)
    outer = _outermost_range_loop(ctx, loop)
    loop_vars: set[str] = set()
    for a in [loop, *[a for a, _ in ctx.ancestors(loop) if isinstance(a, cst.For)]]:
        loop_vars |= _range_loop_vars(a)
    tensors = _tensor_names(ctx, loop)
    for node in _walk_nodes(loop.body):
        if isinstance(node, cst.AssignTarget | cst.AugAssign) and isinstance(node.target, cst.Subscript):
            target = node.target
            idx = {n.value for el in target.slice for n in _walk_nodes(el) if isinstance(n, cst.Name)}
            # a tensor made with torch.* here, or 2-D indexing: not a Python list filled by index
            tensor_like = _dotted(target.value) in tensors or len(target.slice) >= 2
            if idx & loop_vars and tensor_like:
                ctx.add("H6", "elementwise-loop", outer,
                        f"Python loop writes tensor elements one at a time (`{ctx.code(target).strip()} = "
                        f"...`){where}: each write is a tiny device op; build it with vectorised ops (arange "
                        "comparisons, tril/triu, masked_fill)", SLOWS, HIGH if hot else MEDIUM, False)
                return


def _tensor_names(ctx: _Module, node: cst.CSTNode) -> set[str]:
    """Names assigned from a torch.* call in the function around node (or the module)."""
    scope: cst.CSTNode = ctx.function_of(node) or ctx.module
    out: set[str] = set()
    for n in _walk_nodes(scope):
        if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and ctx.qual(n.value.func).startswith("torch."):
            out |= {d for t in n.targets if (d := _dotted(t.target))}
    return out


def _outermost_range_loop(ctx: _Module, loop: cst.For) -> cst.For:
    best = loop
    for a, _ in ctx.ancestors(loop):
        if isinstance(a, cst.FunctionDef | cst.ClassDef):
            break
        if isinstance(a, cst.For) and _range_loop_vars(a):
            best = a
    return best


# ----------------------------------------------------------------------------------------------
# H7 ops that fall back to the CPU
# ----------------------------------------------------------------------------------------------

def _h7_fallback_ops(ctx: _Module) -> None:
    for call in ctx.ix.calls:
        f = call.func
        q = ctx.qual(f)
        op: str | None = None
        if q.startswith("torch.") and q.removeprefix("torch.") in FALLBACK_OPS:
            op = q.removeprefix("torch.")
        elif isinstance(f, cst.Attribute) and f.attr.value in FALLBACK_METHODS and not ctx.is_module_ref(f.value):
            op = f.attr.value
        if op is not None:
            ctx.add("H7", "cpu-fallback-op", call,
                    f"`{op}`: {FALLBACK_OPS[op]}, so it runs on the CPU with a device round trip (the run-time "
                    "op report confirms it for the chosen torch_npu)", SLOWS, MEDIUM, False)


# ----------------------------------------------------------------------------------------------
# H8 framework coupling
# ----------------------------------------------------------------------------------------------

def _h8_framework(ctx: _Module) -> None:
    for imp in ctx.ix.imports:
        if not isinstance(imp, cst.ImportFrom) or imp.relative or imp.module is None:
            continue
        mod = _dotted(imp.module) or ""
        if not mod.startswith(("transformers", "vllm")):
            continue
        names = [] if isinstance(imp.names, cst.ImportStar) else [_dotted(a.name) or "" for a in imp.names]
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        flash = [n for n in names if n in FLASH_AVAILABILITY_NAMES]
        if private or any(p.startswith("_") for p in mod.split(".")):
            ctx.add("H8", "private-framework-import", imp,
                    f"imports private `{mod}` names ({', '.join(private) or mod}): they change between releases, "
                    "and the Ascend stack pins its own transformers/vLLM versions", BLOCKS, MEDIUM, False)
        elif mod in FRAMEWORK_INTERNAL_MODULES:
            ctx.add("H8", "framework-internals-import", imp,
                    f"imports internals of `{mod}`: not a stable API, and tied to CUDA flash-attn handling",
                    BLOCKS, MEDIUM, False)
        elif mod.startswith(("transformers.models.", "vllm.model_executor.")):
            ctx.add("H8", "framework-model-import", imp,
                    f"imports from `{mod}`: model internals move between releases; pin-compatible only with "
                    "the version it was written for", BLOCKS, LOW, False)
        if flash:
            ctx.add("H8", "flash-attn-availability-check", imp,
                    f"`{flash[0]}` checks for CUDA flash-attn: always False on Ascend, and renamed across "
                    "transformers releases", BLOCKS, LOW, False)
    for ref in ctx.refs:
        # a dotted use (`import_utils.is_flash_attn_2_available()`); names imported bare are reported above
        if isinstance(ref.node, cst.Attribute) and ref.node.attr.value in FLASH_AVAILABILITY_NAMES:
            ctx.add("H8", "flash-attn-availability-check", ref.node,
                    "checks for CUDA flash-attn: always False on Ascend, and renamed across transformers "
                    "releases", BLOCKS, LOW, False)
    for arg in ctx.ix.args:
        if arg.keyword is not None and arg.keyword.value == "trust_remote_code" \
                and isinstance(arg.value, cst.Name) and arg.value.value == "True":
            ctx.add("H8", "trust-remote-code", arg,
                    "trust_remote_code=True runs the model repo's own Python: it is tied to the transformers "
                    "version it was written for, and serving workers must be able to import it (spawn)",
                    BLOCKS, LOW, False)


def _scan_text_file(text: str, rel: str, name: str) -> list[Finding]:
    """requirements*.txt, README pip lines, shell scripts."""
    out: list[Finding] = []
    is_req = fnmatch.fnmatch(name, "requirements*.txt")
    for i, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0] if is_req or name.endswith(".sh") else raw
        snippet = raw.strip()
        if is_req or "pip install" in line:
            out.extend(_requirement_findings(line, rel, i, snippet, is_req))
        if name.endswith(".sh") or "export " in line or "pip install" in line:
            out.extend(_env_line_findings(line, rel, i, snippet))
    return out


def _requirement_findings(line: str, rel: str, lineno: int, snippet: str, is_req: bool) -> list[Finding]:
    out: list[Finding] = []
    names: list[tuple[str, int]] = []
    for m in PIN_RE.finditer(line):
        pkg, ver = m.group(1), m.group(3)
        norm = pkg.lower().replace("_", "-")
        names.append((norm, m.start()))
        if norm in CUDA_ONLY_REQUIREMENTS:
            continue  # reported below as a CUDA-only requirement
        sev = MEDIUM if norm in FRAMEWORK_PACKAGES else LOW
        out.append(_text_finding("H8", "exact-pin", rel, lineno, m.start(), snippet,
                                 f"exact pin `{pkg}=={ver}`: torch_npu and vllm-ascend pair with specific torch/"
                                 "transformers releases, so an exact pin may not install beside them; loosen it "
                                 "or check the compatibility table", BLOCKS, sev, False))
    if is_req:
        m2 = REQ_NAME_RE.match(line)
        if m2 and not line.lstrip().startswith("-"):
            names.append((m2.group(1).lower().replace("_", "-"), m2.start(1)))
    else:
        for tok in re.finditer(r"(?<=\s)([A-Za-z][A-Za-z0-9._-]*)", line.split("pip install", 1)[-1]):
            names.append((tok.group(1).lower().replace("_", "-"), line.find(tok.group(1))))
    for norm, col in names:
        if norm in CUDA_ONLY_REQUIREMENTS:
            out.append(_text_finding("H3", "cuda-only-requirement", rel, lineno, col, snippet,
                                     f"requires `{norm}`, a CUDA-only package: it does not install or import on "
                                     "Ascend; drop it and port its call sites", BLOCKS, HIGH, False))
            break
    cw = CUDA_WHEEL_RE.search(line)
    if cw:
        out.append(_text_finding("H8", "cuda-wheel", rel, lineno, cw.start(), snippet,
                                 "pulls a CUDA build of torch (cuXXX wheel or index); Ascend needs the CPU "
                                 "build of torch plus torch_npu", BLOCKS, MEDIUM, False))
    return out


def _env_line_findings(line: str, rel: str, lineno: int, snippet: str) -> list[Finding]:
    out: list[Finding] = []
    m = re.search(r"\bCUDA_VISIBLE_DEVICES\s*=", line)
    if m:
        out.append(_text_finding("H1", "cuda-visible-devices", rel, lineno, m.start(), snippet,
                                 "CUDA_VISIBLE_DEVICES selects GPUs only; Ascend reads ASCEND_RT_VISIBLE_DEVICES",
                                 BLOCKS, MEDIUM, True))
    m = re.search(r"\bNCCL_[A-Z_]+\s*=", line)
    if m:
        out.append(_text_finding("H9", "nccl-env", rel, lineno, m.start(), snippet,
                                 "NCCL_* settings do nothing on Ascend, whose collectives use HCCL (HCCL_* "
                                 "variables)", SLOWS, LOW, False))
    m = re.search(r"\bVLLM_ATTENTION_BACKEND\s*=\s*[\"']?(\w+)", line)
    if m and m.group(1) in CUDA_ATTENTION_BACKENDS:
        out.append(_text_finding("H10", "vllm-attention-backend", rel, lineno, m.start(), snippet,
                                 f"VLLM_ATTENTION_BACKEND={m.group(1)} forces a CUDA attention backend; "
                                 "vllm-ascend picks its own, so unset it", BLOCKS, HIGH, True))
    m = re.search(r"\bVLLM_WORKER_MULTIPROC_METHOD\s*=\s*[\"']?fork", line)
    if m:
        out.append(_text_finding("H10", "vllm-fork-workers", rel, lineno, m.start(), snippet,
                                 "vLLM workers by fork: a forked child cannot use an NPU runtime initialised in "
                                 "the parent, and remote model code must be importable; use spawn", BLOCKS,
                                 MEDIUM, True))
    return out


def _scan_setup_pins(text: str, rel: str) -> list[Finding]:
    """Exact pins in setup.py install_requires strings."""
    out: list[Finding] = []
    for i, raw in enumerate(text.splitlines(), start=1):
        for m in re.finditer(r"[\"']([^\"']*==[^\"']*)[\"']", raw):
            out.extend(_requirement_findings(m.group(1), rel, i, raw.strip(), True))
    return out


# ----------------------------------------------------------------------------------------------
# H9 distributed
# ----------------------------------------------------------------------------------------------

def _h9_distributed(ctx: _Module) -> None:
    for s in ctx.ix.strings:
        value = _string_value(s) or ""
        if value == "nccl" or re.fullmatch(r"(\w+:\w+,)*cuda:nccl(,\w+:\w+)*", value):
            ctx.add("H9", "nccl-backend", s,
                    "the nccl backend needs NVIDIA GPUs; Ascend's collective backend is hccl", BLOCKS, HIGH)
        elif re.fullmatch(r"NCCL_[A-Z0-9_]+", value):
            ctx.add("H9", "nccl-env", s,
                    f"{value} configures NCCL only; it does nothing on Ascend (HCCL_* variables instead)",
                    SLOWS, LOW, False)
    for ref in ctx.refs:
        if ref.qual.startswith("torch.cuda.nccl") or ref.qual.endswith("is_nccl_available"):
            ctx.add("H9", "nccl-api", ref.node,
                    f"`{ref.qual}` is NCCL-specific; Ascend uses HCCL through torch.distributed", BLOCKS, HIGH)
    for call in ctx.ix.calls:
        q = ctx.qual(call.func)
        if q.endswith("init_process_group") and _positional(call, 0) is None and _kwarg(call, "backend") is None:
            ctx.add("H9", "process-group-init", call,
                    "init_process_group without a backend picks one by device: on Ascend import torch_npu first "
                    "so hccl is registered, or pass backend=\"hccl\"", BLOCKS, LOW)


# ----------------------------------------------------------------------------------------------
# H10 serving
# ----------------------------------------------------------------------------------------------

def _h10_serving(ctx: _Module) -> None:
    for arg in ctx.ix.args:
        kw = arg.keyword.value if arg.keyword is not None else ""
        if kw == "enforce_eager" and isinstance(arg.value, cst.Name) and arg.value.value == "False":
            ctx.add("H10", "cuda-graph-mode", arg,
                    "enforce_eager=False asks vLLM to capture CUDA graphs; vllm-ascend has its own graph mode "
                    "with other capture sizes and limits: start eager, then enable its graph mode", BLOCKS, MEDIUM)
        elif kw in CUDA_GRAPH_KNOBS:
            ctx.add("H10", "cuda-graph-knob", arg,
                    f"`{kw}` tunes CUDA-graph capture; vllm-ascend's graph mode is configured differently",
                    SLOWS, LOW)
        elif kw in ("VLLM_ATTENTION_BACKEND", "VLLM_WORKER_MULTIPROC_METHOD"):
            _h10_env(ctx, arg, kw, arg.value)
    for s in ctx.ix.strings:
        value = _string_value(s)
        if value in ("VLLM_ATTENTION_BACKEND", "VLLM_WORKER_MULTIPROC_METHOD"):
            _h10_env(ctx, s, value or "", _env_value(ctx, s))
        elif value in CUDA_GRAPH_KNOBS and isinstance(ctx.parent(s), cst.DictElement):
            ctx.add("H10", "cuda-graph-knob", s,
                    f"`{value}` tunes CUDA-graph capture; vllm-ascend's graph mode is configured differently",
                    SLOWS, LOW)
    for call in ctx.ix.calls:
        if _last_name(call.func) in ("set_start_method", "get_context"):
            first = _positional(call, 0)
            if first is not None and _string_value(first) == "fork":
                ctx.add("H10", "fork-start-method", call,
                        "multiprocessing by fork: a forked child cannot use an NPU runtime initialised in the "
                        "parent, and remote model code must re-import; use \"spawn\"", BLOCKS, MEDIUM)


def _h10_env(ctx: _Module, node: cst.CSTNode, key: str, value_node: cst.CSTNode | None) -> None:
    value = _string_value(value_node) if value_node is not None else None
    if key == "VLLM_ATTENTION_BACKEND" and value is not None and value in CUDA_ATTENTION_BACKENDS:
        ctx.add("H10", "vllm-attention-backend", node,
                f"VLLM_ATTENTION_BACKEND={value} forces a CUDA attention backend; vllm-ascend picks its own, "
                "so unset it", BLOCKS, HIGH)
    elif key == "VLLM_WORKER_MULTIPROC_METHOD" and value == "fork":
        ctx.add("H10", "vllm-fork-workers", node,
                "vLLM workers by fork: a forked child cannot use an NPU runtime initialised in the parent, and "
                "remote model code must be importable; use spawn", BLOCKS, MEDIUM)


def _env_value(ctx: _Module, key: cst.CSTNode) -> cst.CSTNode | None:
    """The value written for an env key: os.environ[K] = V, setdefault(K, V), putenv(K, V), {K: V}."""
    p = ctx.parent(key)
    if isinstance(p, cst.DictElement) and p.key is key:
        return p.value
    if isinstance(p, cst.Arg):
        call = ctx.parent(p)
        if isinstance(call, cst.Call) and _last_name(call.func) in ("setdefault", "putenv") \
                and _positional(call, 0) is key:
            return _positional(call, 1)
        return None
    for a, _ in ctx.ancestors(key):
        if isinstance(a, cst.Subscript | cst.SubscriptElement | cst.Index):
            continue
        if isinstance(a, cst.AssignTarget):
            assign = ctx.parent(a)
            return assign.value if isinstance(assign, cst.Assign) else None
        return None
    return None


# ----------------------------------------------------------------------------------------------
# H11 latent bugs
# ----------------------------------------------------------------------------------------------

def _find_device_fallbacks(ctx: _Module) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    for ref in ctx.refs:
        if ref.qual != "torch.cuda.is_available":
            continue
        for a, child in ctx.ancestors(ref.node):
            if isinstance(a, cst.IfExp) and child is a.test:
                if _mentions_cpu(a.body) or _mentions_cpu(a.orelse):
                    out.append(a)
                break
            if isinstance(a, cst.If) and child is a.test:
                if a.orelse is not None and _mentions_cpu(a.orelse):
                    out.append(a)
                break
            if isinstance(a, cst.BaseSmallStatement | cst.BaseCompoundStatement):
                break
    return out


def _mentions_cpu(node: cst.CSTNode) -> bool:
    return any(_string_value(n) == "cpu" for n in _walk_nodes(node)
               if isinstance(n, cst.SimpleString | cst.FormattedString))


def _h11_latent(ctx: _Module) -> None:
    for node in ctx.fallback_devices:
        ctx.add("H11", "device-fallback-to-cpu", node,
                "device check falls back to \"cpu\" when CUDA is absent: on Ascend it silently picks the CPU "
                "while the model and inputs are on the NPU (device-mismatch errors or a slow CPU run); ask "
                "for the NPU too, or take the device from the model's parameters", BLOCKS, HIGH)
    flow = ctx.flow
    for call, origins in flow.mixed_cats:
        ctx.add("H11", "mixed-device-cat", call,
                f"`{_last_name(call.func)}` joins tensors from different places ({', '.join(sorted(origins))}): "
                "once CUDA is gone they land on different devices and the op fails", BLOCKS, MEDIUM)
    for node in flow.inplace_expanded:
        ctx.add("H11", "inplace-on-expanded-view", node,
                "in-place write into an expanded (broadcast) view: many elements share one memory location, "
                "and on Ascend non-contiguous views may be copied for the kernel, so the write can be lost or "
                "fail; .clone() (or .contiguous()) first", NUMBERS, MEDIUM)
    for call in flow.masked_scatter_cuda:
        ctx.add("H11", "masked-scatter-device", call,
                "masked_scatter with a mask moved by `.cuda()`: once ported, mask and tensor must be on the "
                "same device (and the mask bool, same shape); move the mask with `.to(x.device)`", BLOCKS, HIGH)


# ----------------------------------------------------------------------------------------------
# The intra-function dataflow (simple assignments)
# ----------------------------------------------------------------------------------------------

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


class _Flow:
    def __init__(self, ctx: _Module) -> None:
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
            key = _dotted(st.target)
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
        key = _dotted(target)
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
            key = _dotted(e)
            if key and key in self.env:
                return self.env[key]
            if e.attr.value in _METADATA_ATTRS:
                return _EMPTY
            base = self.eval(e.value)
            if e.attr.value == "device":
                return _Val(base.origins())
            return base if e.attr.value in ("T", "mT", "data") else _Val(base.sticky())
        if isinstance(e, cst.SimpleString | cst.FormattedString):
            s = _string_value(e)
            return _Val(frozenset({"o:cpu"})) if s == "cpu" else \
                _Val(frozenset({"o:cuda"})) if _is_cuda_device_string(s) else _EMPTY
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
        if isinstance(op, cst.Multiply) and _dotted(e.left) and _dotted(e.left) == _dotted(e.right):
            return _Val(tags | {"sq"})
        return _Val(tags, left.site or right.site)

    def call(self, e: cst.Call) -> _Val:
        ctx = self.ctx
        f = e.func
        name = _last_name(f)
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
            if "o:cuda" in args[0].tags or any(isinstance(n, cst.Call) and _last_name(n.func) == "cuda"
                                               for n in _walk_nodes(mask)):
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
        dev = _kwarg(e, "device")
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


FAMILIES = (_h1_cuda_device, _h2_autocast, _h3_cuda_libraries, _h4_attention, _h5_dtypes, _h6_host_sync,
            _h7_fallback_ops, _h8_framework, _h9_distributed, _h10_serving, _h11_latent)
