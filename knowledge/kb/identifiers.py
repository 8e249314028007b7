"""Identifiers that make retrieval op-aware.

Queries and chunks are both reduced to normalised keys ("op:npu_rms_norm", "aclnn:aclnnmatmul",
"code:ez1001", "env:TORCH_NPU_FALLBACK_CPU_DISABLE", "hz:h7"); a query's keys select chunks by
metadata before dense search fills the rest. Pure regex work, no heavy imports.
"""

from __future__ import annotations

import re

MAX_KEYS = 64

# torch sub-namespaces that are modules, not ops: `torch.cuda.x` must not become op "cuda".
_TORCH_MODULES = frozenset(
    [
        "cuda",
        "npu",
        "nn",
        "distributed",
        "utils",
        "backends",
        "amp",
        "autograd",
        "jit",
        "onnx",
        "fx",
        "optim",
        "hub",
        "compiler",
        "profiler",
        "testing",
        "cpu",
        "mps",
        "xpu",
        "accelerator",
        "sparse",
        "nested",
        "func",
        "package",
        "overrides",
        "monitor",
        "library",
        "export",
        "dir",
        "meta",
        "dynamo",
        "version",
        "quantization",
        "ao",
        "multiprocessing",
        "random",
        "serialization",
        "storage",
        "types",
        "version",
        "futures",
        "distributions",
        "masked",
        "signal",
        "ops",
        "Tensor",
        "_C",
        "_dynamo",
        "_inductor",
        "contrib",
        "device",
        "dtype",
        "float16",
        "bfloat16",
        "float32",
        "float64",
        "float",
        "half",
        "double",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "long",
        "int",
        "float8_e4m3fn",
        "float8_e5m2",
    ]
)
# torch.<ns>.x maps to the aten name "<prefix>x" (torch.linalg.lstsq -> aten::linalg_lstsq).
_NS_PREFIX = {"linalg": "linalg_", "special": "special_", "fft": "fft_", "Tensor": "", "functional": ""}

_ATEN = re.compile(r"\baten::([A-Za-z_][A-Za-z0-9_]*)")
_OPS_NS = re.compile(r"\btorch\.ops\.(?:aten|npu)\.([A-Za-z_][A-Za-z0-9_]*)")
_ACLNN = re.compile(r"\b(aclnn[A-Z][A-Za-z0-9]*)")
_ACLRT = re.compile(r"\b([Aa]cl(?:rt|op)[A-Z][A-Za-z0-9]*)")  # runtime APIs: aclrtSynchronizeStream
# `torch_npu.npu.synchronize` / `torch_npu.dir/` (a CMake path) name a module or a folder, not an op
_TORCH_NPU = re.compile(r"\btorch_npu\.([A-Za-z_][A-Za-z0-9_]*)(?![\w./\\])")
_NPU_BARE = re.compile(r"(?<![\w.])(npu_[a-z0-9_]*[a-z0-9])\b")
_TORCH_DOTTED = re.compile(
    r"\b(torch(?:\.[A-Za-z_][A-Za-z0-9_]*)+|Tensor\.[a-z_][a-z0-9_]*\b|F\.[a-z_][a-z0-9_]*\b)"
)
# Codes are often glued to Chinese text, where \b does not separate: ASCII look-arounds instead.
_CODE = re.compile(r"(?<![A-Za-z0-9_])(E[A-Z0-9]\d{4}|ERR\d{5})(?![A-Za-z0-9_])")
# aclnn returns (161xxx/361xxx/561xxx) and runtime errors (107xxx, 207xxx, 507xxx: ACL_ERROR_RT_*)
_ACL_RET = re.compile(r"(?<![A-Za-z0-9_.])((?:161|361|561|107|207|507)\d{3})(?![A-Za-z0-9_.])")
_LIB = re.compile(r"(?<![\w.])(lib[A-Za-z0-9_+-]+\.so)(?:\.[0-9.]+)?\b")
_ENV = re.compile(r"(?<![A-Za-z0-9_])([A-Z][A-Z0-9]+(?:_[A-Z0-9]+)+)(?![A-Za-z0-9_])")
_ENV_SKIP = ("DT_", "ACL_FORMAT", "FORMAT_", "ERR", "NPU_FUNCTION", "ACL_ERROR", "ACLNN_ERR")
# An ALL-CAPS token is an environment variable when it carries the vocabulary of the Ascend / torch
# environment lists (the docs' variable tables use these prefixes), or when the text sets or reads it.
_ENV_PREFIXES = (
    "ASCEND_", "TORCH_NPU_", "PYTORCH_NPU_", "TORCH_DEVICE_BACKEND_AUTOLOAD", "HCCL_", "NPU_", "ACL_",
    "TASK_QUEUE_ENABLE", "COMBINED_ENABLE", "INF_NAN_MODE", "MULTI_STREAM_MEMORY_REUSE", "ATB_", "LCCL_",
    "VLLM_", "ASDOPS_", "OMP_", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA_ALLOC_CONF", "TORCH_TRANSFER_TO_NPU", "MINDIE_", "MS_", "GE_", "TE_", "OPS_", "CPU_AFFINITY",
    "RANK_TABLE", "RANK_ID", "RANK_SIZE", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK",
)
_ENV_USE = re.compile(
    r"(?:\bexport\s+|\$\{?|environ(?:\.get)?\(?\[?\s*['\"]|getenv\(\s*['\"])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"
    r"|(?<![A-Za-z0-9_])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)=(?=\S)"
)
# Any hazard id (H1, H17, a new H18): the classes are listed once, in agents/rules/registry.py.
_HAZARD = re.compile(r"\b[Hh]([1-9][0-9]?)\b")


def _torch_api_keys(dotted: str) -> list[str]:
    """`torch.isneginf`, `torch.Tensor.add_`, `torch.linalg.lstsq`, `F.softmax` -> op keys."""
    parts = dotted.split(".")
    if parts[0] == "F":
        parts = ["torch", "nn", "functional", *parts[1:]]
    if parts[0] == "Tensor":
        parts = ["torch", *parts]
    if len(parts) < 2 or parts[0] != "torch":
        return []
    name = parts[-1]
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name.startswith("__"):
        return []
    middle = parts[1:-1]
    if not middle:
        return [] if name in _TORCH_MODULES else [f"op:{name}"]
    if middle in (["Tensor"], ["nn", "functional"]):
        return [f"op:{name}"]
    if len(middle) == 1 and middle[0] in _NS_PREFIX:
        return [f"op:{_NS_PREFIX[middle[0]]}{name}"]
    return []


def extract_keys(text: str, *, hazards: bool = False) -> list[str]:
    """Normalised identifier keys in ``text``, in first-seen order, at most MAX_KEYS.

    ``hazards`` also reads hazard ids, H1, H2, ... (only queries and our recipes use those: in docs "H1" is noise).
    """
    text = text.replace("\\_", "_")
    keys: list[str] = []

    def add(key: str) -> None:
        if key not in keys and len(keys) < MAX_KEYS:
            keys.append(key)

    for m in _ATEN.finditer(text):
        add(f"op:{m.group(1)}")
    for m in _OPS_NS.finditer(text):
        add(f"op:{m.group(1)}")
    for m in _ACLNN.finditer(text):
        add(f"aclnn:{m.group(1).lower()}")
    for m in _ACLRT.finditer(text):
        # torch_npu wraps the runtime calls: AclrtSynchronizeStreamWithTimeout is aclrtSynchronizeStream
        add(f"api:{re.sub(r'WithTimeout$', '', m.group(1)).lower()}")
    for m in _TORCH_NPU.finditer(text):
        if m.group(1) not in _TORCH_MODULES and not m.group(1).startswith("_"):
            add(f"op:{m.group(1)}")
    for m in _NPU_BARE.finditer(text):
        add(f"op:{m.group(1)}")
    for m in _TORCH_DOTTED.finditer(text):
        for k in _torch_api_keys(m.group(1)):
            add(k)
    for m in _CODE.finditer(text):
        add(f"code:{m.group(1).lower()}")
    for m in _ACL_RET.finditer(text):
        add(f"code:{m.group(1)}")
    for m in _LIB.finditer(text):
        add(f"lib:{m.group(1).lower()}")
    used = {a or b for a, b in _ENV_USE.findall(text)}
    for m in _ENV.finditer(text):
        name = m.group(1)
        if (
            len(name) >= 6
            and not name.startswith(_ENV_SKIP)
            and not _CODE.fullmatch(name)
            and (name.startswith(_ENV_PREFIXES) or name in used)
        ):
            add(f"env:{name}")
    if hazards:
        for m in _HAZARD.finditer(text):
            add(f"hz:h{m.group(1)}")
    return keys


def op_key(name: str) -> str:
    """Key for an op name as written in a matrix or a heading: `add.Tensor`, `aten::add`, `npu_x`."""
    name = name.strip()
    if name.startswith("aten::"):
        name = name[len("aten::") :]
    if name.startswith("torch_npu."):
        name = name[len("torch_npu.") :]
    return f"op:{name.split('.')[0]}"
