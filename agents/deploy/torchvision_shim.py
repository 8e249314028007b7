"""The ``sitecustomize`` of npuport's python-only torchvision (agents/deploy/vllm_vision.py copies this file,
as it is, beside a torchvision whose native libraries do not load with this torch and were removed).

torchvision registers fake (meta) kernels for its native ops at import time, unconditionally for some
(``torch.library.register_fake("torchvision::nms")``): without its native library that raises
``operator torchvision::nms does not exist`` and ``import torchvision`` fails, although its Python parts
(``torchvision.transforms``, which vLLM's image processors use) need no native op. This hook lets
``torchvision._meta_registrations`` skip a fake kernel for an op that does not exist, and nothing else:
the native ops stay absent (``torchvision.ops.nms`` raises torchvision's own "Couldn't load custom C++
ops"), every other import is untouched. Standard library only; torch is imported only when torchvision is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

_MODULE = "torchvision._meta_registrations"


def _op_exists(qualname: str) -> bool:
    import torch

    namespace, _, name = qualname.partition("::")
    try:
        getattr(getattr(torch.ops, namespace), name.split(".")[0])
    except (AttributeError, RuntimeError):
        return False
    return True


class _Lenient(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        import torch.library as library

        original = library.register_fake

        def register_fake(op: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(op, str) and not _op_exists(op):
                return lambda fn: fn  # no native op: nothing to give a fake kernel to
            return original(op, *args, **kwargs)

        library.register_fake = register_fake  # type: ignore[assignment]
        try:
            self.inner.exec_module(module)
        finally:
            library.register_fake = original


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Lenient(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
