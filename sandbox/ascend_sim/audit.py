"""Fidelity audit of the emulated torch_npu surface against what real libraries reference.

Reads Python sources (installed transformers / accelerate, and a vllm-ascend tree or the committed list
of its references) and collects every torch_npu attribute, submodule and custom op they name:
`torch_npu.a.b`, `from torch_npu.x import y`, `import torch_npu.x`, `torch.npu.a` (torch_npu's device
module) and `torch.ops.npu.op`. Then, with ascend-sim installed in this process, resolves each one and
classifies it:

- provided: it resolves;
- refused: it does not, the emulator lists it as deliberately not emulated (`REFUSED`, with the reason),
  and resolving raises exactly the error a host whose torch_npu lacks that API gives (AttributeError /
  ModuleNotFoundError in Python's own wording, never an emulator-internal error);
- missing: anything else. A library upgrade that starts using a new API shows up here.

Run: `python -m sandbox.ascend_sim.audit [--json] [--vllm-ascend-src DIR]` (exit 1 when missing > 0).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Deliberately not emulated, by pattern over the dotted reference, with the reason (docs/ascend-sim.md).
REFUSED: tuple[tuple[str, str], ...] = (
    (r"torch_npu\._C(\..*)?|torch_npu\.npu\._.*|torch_npu\.op_plugin(\..*)?",
     "private bindings and internals of a real build (the C extension, op-plugin registration, stream "
     "callbacks): nothing a port should call"),
    (r"torch_npu\.(distributed|_inductor|dynamo|multiprocessing)(\..*)?|torch(_npu)?\.npu\.(.*[Gg]raph.*|"
     r"is_current_stream_capturing)|.*(reduce_scatter|all_gather|alltoall|distribute).*",
     "graph capture (ACLGraph, torchair), inductor, HCCL collectives and cross-process npu tensors: one "
     "emulated device, no graph mode"),
    (r"torch_npu\.profiler(\..*)?", "the profiler needs a device timeline; none is emulated"),
    (r"torch_npu\.(npu_format_cast.*|get_npu_format|empty_with_format|Format(\..*)?)",
     "private formats (NZ, NC1HWC0) are not modelled: every tensor is ND"),
    (r"torch_npu\.(hifloat8|float8_e8m0fnu|float4_e2m1fn_x2)", "NPU-only data types are not emulated"),
    (r"(torch_npu|torch\.ops\.npu)\.\w*(quant|int4|mx_|kronecker)\w*(\..*)?",
     "quantized kernels are not emulated"),
    (r"(torch_npu|torch\.ops\.npu)\.\w*(moe|grouped_matmul|gmm|token_permute|token_unpermute)\w*(\..*)?",
     "MoE routing and grouped-matmul kernels are not emulated"),
    (r"(torch_npu|torch\.ops\.npu)\.\w*(paged|incre|fused_infer|kv|cache|lightning|mla|attention_update|"
     r"_npu_flash_attention)\w*(\..*)?",
     "paged / incremental attention and KV-cache kernels of serving engines are not emulated "
     "(npu_fusion_attention and npu_prompt_flash_attention are)"),
    (r"torch\.ops\.npu\.\w+",
     "torch_npu's ops are emulated as the torch_npu.npu_* functions; the torch.ops.npu registrations are not"),
    (r"torch_npu\.(_npu_matmul_add_fp32|_npu_rotary_embedding|npu_apply_rotary_pos_emb|npu_chunk_gated_delta_rule|"
     r"npu_clipped_swiglu|npu_fast_gelu|npu_interleave_rope|npu_mrope|npu_scatter_nd_update_|npu_top_k_top_p|"
     r"npu_transpose_batchmatmul)",
     "a fused op not emulated yet: the code gets the AttributeError of a torch_npu build without it, so "
     "the port must use an emulated op or plain torch"),
    (r"torch(_npu)?\.npu\.(ExternalEvent|set_stream|memory\.(MemPool|NPUPluggableAllocator|use_mem_pool|"
     r"memory_snapshot))",
     "device runtime controls without a CPU counterpart (external events, stream switching, pluggable "
     "allocators and memory pools, allocator snapshots)"),
)

# Python's own wording for an absent attribute or module: what a host whose torch_npu lacks the API says.
_REAL_ERRORS = (
    re.compile(r"^module '[\w.]+' has no attribute '\w+'$"),
    re.compile(r"^No module named '[\w.]+'$"),
    re.compile(r"^cannot import name '\w+' from '[\w.]+'"),
    re.compile(r"^type object '\w+' has no attribute '\w+'$"),
    re.compile(r"^'_OpNamespace' '\w+' object has no attribute '\w+'$"),
    re.compile(r"^'\w+' object has no attribute '\w+'$"),
)

_ROOTS = ("torch_npu", "torch.npu", "torch.ops.npu")


def _generic_device_module(node: ast.expr) -> bool:
    """`getattr(torch, device_type)` / `torch.get_device_module(device)`: device-generic code, which on
    an Ascend host reaches torch.npu (accelerate and transformers call the device module this way)."""
    if not isinstance(node, ast.Call) or not node.args:
        return False
    f = node.func
    if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) >= 2:
        first, second = node.args[0], node.args[1]
        npu_or_variable = not isinstance(second, ast.Constant) or second.value == "npu"
        return isinstance(first, ast.Name) and first.id == "torch" and npu_or_variable
    return (isinstance(f, ast.Attribute) and f.attr == "get_device_module"
            and isinstance(f.value, ast.Name) and f.value.id == "torch")


def _chain(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if _generic_device_module(node):
        return ["@device", *parts[::-1]] if parts else None
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def references_in_source(text: str) -> set[str]:
    """Dotted torch_npu references in one Python source (aliases of torch_npu modules followed)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return set()
    aliases: dict[str, str] = {"torch_npu": "torch_npu", "torch": "torch", "@device": "torch.npu"}
    refs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "torch_npu" or a.name.startswith("torch_npu."):
                    refs.add(a.name)
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "torch_npu" or node.module.startswith("torch_npu."):
                refs.add(node.module)
                for a in node.names:
                    if a.name != "*":
                        refs.add(f"{node.module}.{a.name}")
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif node.module == "torch" and any(a.name == "npu" for a in node.names):
                for a in node.names:
                    if a.name == "npu":
                        aliases[a.asname or "npu"] = "torch.npu"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = _chain(node)
            if not parts or parts[0] not in aliases:
                continue
            dotted = ".".join([aliases[parts[0]], *parts[1:]])
            if any(dotted == r or dotted.startswith(r + ".") for r in _ROOTS):
                refs.add(_trim(dotted))
    return {r for r in refs if r not in ("torch", "torch.ops")}


def _trim(dotted: str) -> str:
    # Calls and methods on returned objects are not part of the surface; keep the chain as named, but at
    # most one level under a custom op (torch.ops.npu.op.default -> torch.ops.npu.op).
    if dotted.startswith("torch.ops.npu."):
        return ".".join(dotted.split(".")[:4])
    return dotted


def references_in_tree(root: Path) -> set[str]:
    refs: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        if "tests" in path.relative_to(root).parts:
            continue  # what the library runs, not its test suite
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if "torch_npu" in text or "torch.npu" in text or "ops.npu" in text:
            refs |= references_in_source(text)
    return refs


def package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def load_list(path: Path) -> set[str]:
    lines = path.read_text().splitlines()
    return {ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")}


def resolve(dotted: str) -> Any:
    """Resolve a dotted reference as the referencing code would: attribute access, importing a
    submodule when a package lacks the attribute (as `import a.b` / `from a import b` do)."""
    parts = dotted.split(".")
    obj: Any = importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, name)
        except AttributeError:
            if not hasattr(obj, "__path__"):
                raise
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError:
                raise AttributeError(f"module '{obj.__name__}' has no attribute '{name}'") from None
    return obj


def refusal(dotted: str) -> str | None:
    for pattern, why in REFUSED:
        if re.fullmatch(pattern, dotted):
            return why
    return None


def classify(refs: Iterable[str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for ref in sorted(set(refs)):
        try:
            resolve(ref)
        except Exception as exc:  # every failure is classified, none escapes the audit
            msg = str(exc).strip("'\"") if isinstance(exc, KeyError) else str(exc)
            real = isinstance(exc, (AttributeError, ImportError)) and any(p.match(msg) for p in _REAL_ERRORS)
            why = refusal(ref)
            if real and why is not None:
                out[ref] = {"status": "refused", "error": f"{type(exc).__name__}: {msg}", "why": why}
            else:
                out[ref] = {"status": "missing", "error": f"{type(exc).__name__}: {msg}", "why": why or ""}
        else:
            out[ref] = {"status": "provided"}
    return out


def collect(vllm_src: Path | None, vllm_list: Path | None) -> dict[str, set[str]]:
    """References per library: installed transformers and accelerate, and vllm-ascend."""
    sources: dict[str, set[str]] = {}
    for lib in ("transformers", "accelerate"):
        d = package_dir(lib)
        if d is not None:
            sources[lib] = references_in_tree(d)
    if vllm_src is not None and vllm_src.is_dir():
        sources["vllm-ascend"] = references_in_tree(vllm_src)
    elif vllm_list is not None and vllm_list.is_file():
        sources["vllm-ascend"] = load_list(vllm_list)
    return sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from knowledge.settings import settings

    src = settings().vllm_ascend_src
    ap.add_argument("--vllm-ascend-src", default=str(src) if src is not None else None)
    ap.add_argument("--vllm-ascend-list", default=None, help="committed list of vllm-ascend's references")
    ap.add_argument("--list-only", action="store_true", help="print the references, one a line, and exit")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--options", default="{}", help="ascend_sim.install options (JSON)")
    args = ap.parse_args(argv)
    src = Path(args.vllm_ascend_src) if args.vllm_ascend_src else None
    lst = Path(args.vllm_ascend_list) if args.vllm_ascend_list else None
    sources = collect(src, lst)
    refs = set().union(*sources.values()) if sources else set()
    if args.list_only:
        print("\n".join(sorted(refs)))
        return 0
    from sandbox import ascend_sim

    ascend_sim.install(json.loads(args.options))
    result = classify(refs)
    counts = {k: sum(1 for v in result.values() if v["status"] == k) for k in ("provided", "refused", "missing")}
    if args.json:
        print(json.dumps({"sources": {k: sorted(v) for k, v in sources.items()}, "result": result}))
    else:
        for ref, v in result.items():
            if v["status"] != "provided":
                print(f"{v['status']:8} {ref}: {v['error']}" + (f" ({v['why']})" if v["why"] else ""))
    print(
        f"sources: {', '.join(f'{k} {len(v)}' for k, v in sources.items())}\n"
        f"referenced {len(result)}, provided {counts['provided']}, "
        f"refused with the real error {counts['refused']}, missing {counts['missing']}"
    )
    return 1 if counts["missing"] else 0


if __name__ == "__main__":
    sys.exit(main())
