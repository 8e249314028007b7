"""How a run gets the model's class into its process: the target's bootstrap (the emulated runtime, or
torch_npu), the cuda redirect, a one-process distributed world, the model folder importable as remote code,
and the CUDA-only imports the original makes unguarded stubbed under the reference redirect. Shared by the
harness's worker, the tuner's benchmark and the deployment's Transformers side, so all three load a model
the same way."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sandbox.harness.model_build import MODEL_PACKAGE, _load_attr
from sandbox.harness.spec import HarnessSpec, HarnessTarget

MAX_STUB_RETRIES = 8
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")

_model_dir_str = ""


def go_offline() -> None:
    """A run has no network: the Hub libraries are told so before they are imported, so a model or
    processor that names a Hub id fails at once (and sandbox/harness/hub_offline.py builds it) instead of
    retrying for minutes."""
    for var in OFFLINE_ENV:
        os.environ.setdefault(var, "1")


def remember_model_dir(model_dir: Path) -> None:
    """The folder whose modules are forgotten when an import is retried with a stub."""
    global _model_dir_str
    _model_dir_str = str(model_dir)


def import_with_stubs(fn: Callable[[], Any], redirect: bool, stubbed: list[str]) -> Any:
    """Call ``fn`` (an import); under the reference redirect, stub CUDA-only modules that the original
    imports unguarded and try again."""
    from sandbox.cuda_redirect import redirect as rd

    for _ in range(MAX_STUB_RETRIES):
        try:
            return fn()
        except ImportError as exc:
            # the ModuleNotFoundError itself, or one the model's code caught and raised again in its own words
            # (``except ImportError: raise ImportError("install flash-rwkv")``)
            missing = _missing_module(exc)
            root = (missing or "").split(".")[0]
            if not redirect or root not in rd.CUDA_ONLY_MODULES or root in stubbed:
                raise
            stubbed.append(root)
            rd.stub_module(missing or root)
            _forget_model_modules()
    return fn()


def _missing_module(exc: BaseException) -> str | None:
    """The module name of the ModuleNotFoundError behind an ImportError (itself, its cause or context)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, ModuleNotFoundError) and cur.name:
            return cur.name
        cur = cur.__cause__ or cur.__context__
    return None


def _forget_model_modules() -> None:
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if _model_dir_str and f.startswith(_model_dir_str) and name != MODEL_PACKAGE:
            del sys.modules[name]


def exception_record(exc: BaseException, model_dir: Path) -> dict[str, Any]:
    """A failure as the result reports it: type, message, frames (which are the model's), traceback, and what
    the live process can tell about it (sandbox/harness/failure_hints.py: the debugger's classes read it)."""
    from sandbox.harness.failure_hints import failure_hints

    return {"type": type(exc).__name__, "message": str(exc), "frames": frames(exc, model_dir),
            "traceback": "".join(traceback.format_exception(exc)), "hints": failure_hints(exc, model_dir)}


def frames(exc: BaseException, model_dir: Path) -> list[dict[str, Any]]:
    out = []
    for fs in traceback.extract_tb(exc.__traceback__):
        fname = fs.filename
        in_model = fname.startswith(str(model_dir))
        rel = os.path.relpath(fname, model_dir) if in_model else fname
        out.append({"file": rel, "line": fs.lineno or 0, "func": fs.name, "code": (fs.line or "").strip(),
                    "in_model": in_model})
    return out


def bootstrap_target(target: HarnessTarget | None) -> ModuleType | None:
    """The target's bootstrap ``module:function``, called with its options before any model code runs."""
    if target is None or not target.bootstrap:
        return None
    mod_name, _, fn_name = target.bootstrap.partition(":")
    bootstrap = importlib.import_module(mod_name)
    getattr(bootstrap, fn_name)(target.options or {})
    return bootstrap


@dataclass
class LoadedClass:
    """The model's class, imported, and what its import needed."""

    model_dir: Path
    cls: Any
    redirected: bool
    stubbed: list[str] = field(default_factory=list)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn`` (a build that may import more of the model's modules) with the same stubs."""
        return import_with_stubs(fn, self.redirected, self.stubbed)


def load_class(spec: HarnessSpec, stubbed: list[str] | None = None) -> LoadedClass:
    """After the target's bootstrap (so cuda can be redirected to its device): the redirect, a world of one
    process (init_process_group, hazard H9), the model folder on the path, and the manifest's class.
    ``stubbed`` collects the CUDA-only modules stubbed on the way (kept by the caller when the import fails)."""
    model_dir = Path(spec.model_dir).resolve()
    remember_model_dir(model_dir)
    if spec.redirect_to:
        from sandbox.cuda_redirect import redirect

        redirect.install(spec.redirect_to)
    from sandbox.cuda_redirect.redirect import install_single_process_world

    install_single_process_world()
    sys.path.insert(0, str(model_dir))
    loaded = LoadedClass(model_dir=model_dir, cls=None, redirected=bool(spec.redirect_to),
                         stubbed=stubbed if stubbed is not None else [])
    loaded.cls = loaded.call(lambda: _load_attr(spec.manifest["entry"]["class"], model_dir))
    return loaded
