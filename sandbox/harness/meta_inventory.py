"""The model's structure at full size, read from its own code: the model is built on the meta device (no
memory, no weights) the way the harness builds it (``model_build.build_model``: the config class, remote
code, Hub sub-models offline), from config.json as written, never shrunk, and its modules are read back.

The inventory lists every module that holds parameters of its own (its type and base types, each
parameter's shape, the conv geometry of a convolution, an embedding's size) and every ModuleList's length.
A list's children that are identical (same types, same shapes) are walked once and carry a ``count``, so a
model of 61 layers x 384 experts is a few hundred entries. agents/projection reads it into layer kinds.

The child (``python -I -m sandbox.harness.meta_inventory SPEC.json``) runs in the sandbox; its result is the
model process's claim about its own structure (a lying model can only mislead its own projection).
:func:`meta_inventory` is the parent side.
"""

from __future__ import annotations

import copy
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from sandbox.harness.model_build import MODEL_PACKAGE
from sandbox.isolation.child_main import child_main
from sandbox.isolation.process import Limits, Mounts, default_sandbox, scrub, scrubbed_env
from sandbox.isolation.rundir import write_own

MAX_ENTRIES = 4000  # a structure larger than this is cut (and says so): the parent's JSON stays small
MAX_RESULT_BYTES = 8 * 2**20
NPUPORT_ROOT = Path(__file__).resolve().parents[2]
_BOOT = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from sandbox.harness.meta_inventory import main; "
         "sys.exit(main(sys.argv[1:]))")


def _signature(module: Any) -> tuple[Any, ...]:
    """What makes two children the same for the projection: types and parameter shapes, all the way down."""
    return tuple((name, type(m).__name__, tuple((p, tuple(t.shape)) for p, t in m.named_parameters(recurse=False)))
                 for name, m in module.named_modules())


def _entry(name: str, module: Any, count: int) -> dict[str, Any]:
    params = {p: list(t.shape) for p, t in module.named_parameters(recurse=False)}
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in module.parameters(recurse=False)})
    out: dict[str, Any] = {"name": name, "type": type(module).__name__,
                           "bases": [c.__name__ for c in type(module).__mro__[1:6]], "params": params,
                           "dtypes": dtypes, "count": count}
    for attr in ("kernel_size", "stride", "num_embeddings", "embedding_dim", "in_features", "out_features"):
        value = getattr(module, attr, None)
        if isinstance(value, int | tuple) and not isinstance(value, bool):
            out[attr] = list(value) if isinstance(value, tuple) else value
    return out


def _walk(module: Any, name: str, count: int, entries: list[dict[str, Any]], lists: list[dict[str, Any]],
          types: dict[str, str]) -> None:
    if len(entries) >= MAX_ENTRIES:
        return
    types[name] = type(module).__name__
    if any(True for _ in module.parameters(recurse=False)):
        entries.append(_entry(name, module, count))
    children = list(module.named_children())
    if type(module).__name__ in ("ModuleList", "Sequential") and children:
        groups: list[list[Any]] = []  # runs of consecutive identical children
        for child_name, child in children:
            sig = _signature(child)
            if groups and groups[-1][0] == sig:
                groups[-1][2] += 1
            else:
                groups.append([sig, (child_name, child), 1])
        lists.append({"name": name, "len": len(children), "count": count,
                      "groups": [{"first": f"{name}.{g[1][0]}" if name else g[1][0], "type": type(g[1][1]).__name__,
                                  "len": g[2]} for g in groups]})
        for _sig, (child_name, child), n in groups:
            _walk(child, f"{name}.{child_name}" if name else child_name, count * n, entries, lists, types)
        return
    for child_name, child in children:
        _walk(child, f"{name}.{child_name}" if name else child_name, count, entries, lists, types)


MAX_STUBS = 12


def with_stubs(fn: Any, stubbed: list[str]) -> Any:
    """``fn()`` (an import, a build) with every module it cannot import stubbed: the meta build never runs a
    forward, so a library the model uses only there (einops, a kernel package) need not be installed. Each
    stub is listed in the result; a call into one raises."""
    from sandbox.cuda_redirect import redirect as rd
    from sandbox.harness.loading import _forget_model_modules, _missing_module

    for _ in range(MAX_STUBS):
        try:
            return fn()
        except ImportError as exc:
            missing = _missing_module(exc)
            if not missing or missing.split(".")[0] in stubbed or missing.startswith(MODEL_PACKAGE):
                raise
            stubbed.append(missing.split(".")[0])
            rd.stub_module(missing)
            _forget_model_modules()
    return fn()


def _build(cls_ref: str, config: dict[str, Any], model_dir: Path, stubbed: list[str]) -> tuple[Any, str]:
    """The model on the meta device; where the constructor needs real values (``.item()`` of a buffer), its
    parameters alone on meta (accelerate's init_empty_weights: buffers stay real, and small)."""
    import torch

    from sandbox.harness.model_build import _load_attr, build_model

    def make() -> Any:
        return with_stubs(lambda: build_model(_load_attr(cls_ref, model_dir), copy.deepcopy(config), model_dir),
                          stubbed)

    try:
        with torch.device("meta"):
            return make(), "meta device"
    except Exception as first:  # a constructor that reads values: try with real buffers
        try:
            from accelerate import init_empty_weights
        except ImportError:
            raise first from None
        with init_empty_weights(include_buffers=False):
            return make(), f"parameters on the meta device, buffers real (meta alone failed: {type(first).__name__})"


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from sandbox.cuda_redirect import redirect
    from sandbox.cuda_redirect.cuda_only import kernel_flags_off
    from sandbox.harness.loading import remember_model_dir
    from sandbox.harness.model_build import _hub_offline

    model_dir = Path(spec["model_dir"]).resolve()
    remember_model_dir(model_dir)  # the model's modules it forgets between stub retries
    manifest = spec["manifest"]
    redirect.install("cpu")  # model code that asks torch.cuda at construction gets answers, as the reference does
    sys.path.insert(0, str(model_dir))
    config: dict[str, Any] = json.loads((model_dir / manifest.get("config", "config.json")).read_text())
    notes = kernel_flags_off(config)
    config.update(manifest.get("config_overrides") or {})
    stubbed: list[str] = []
    offline = _hub_offline(model_dir, manifest, False)
    model, how = _build(manifest["entry"]["class"], config, model_dir, stubbed)
    entries: list[dict[str, Any]] = []
    lists: list[dict[str, Any]] = []
    types: dict[str, str] = {}
    _walk(model, "", 1, entries, lists, types)
    tied = _tied(model)
    return {"ok": True, "built": how, "class": type(model).__name__, "entries": entries, "lists": lists,
            "types": types, "config": config,
            "tied": tied, "cut": len(entries) >= MAX_ENTRIES, "stubbed": stubbed,
            "notes": [*notes, *((offline.notes if offline is not None else []) or [])]}


def _tied(model: Any) -> list[str]:
    """Parameters that are one tensor under two names (an output layer tied to the embedding): each is
    read once per step, and counted once in the weights' memory."""
    seen: dict[int, str] = {}
    tied = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(f"{name}={seen[id(p)]}")
        else:
            seen[id(p)] = name
    return tied


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "exception": {"type": type(exc).__name__, "message": str(exc)[:2000],
                                       "traceback": "".join(traceback.format_exception(exc))[-6000:]}}


def meta_inventory(model_dir: Path, manifest: dict[str, Any], run_dir: Path, *, python: str | None = None,
                   wall_s: float = 120.0) -> dict[str, Any]:
    """Run the child in the sandbox on ``model_dir`` (read-only) with ``python`` (the port's environment, or
    npuport's own); its result, or ``{"ok": False, "error": ...}``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / "meta_inventory.spec.json"
    write_own(spec_path, json.dumps({"model_dir": str(model_dir.resolve()), "manifest": manifest}))
    # -I keeps the model folder and the environment's variables out of sys.path; npuport's root is put first
    argv = [python or sys.executable, "-I", "-B", "-u", "-c", _BOOT, str(NPUPORT_ROOT), str(spec_path)]
    res = default_sandbox().execute(argv, cwd=run_dir.resolve(), env=scrubbed_env({}), limits=Limits(wall_s=wall_s),
                                    mounts=Mounts(ro=(model_dir.resolve(),), rw=(run_dir.resolve(),),
                                                  interpreters=(python,) if python else ()),
                                    result_channel=True, channel_cap=MAX_RESULT_BYTES)
    try:
        out = json.loads(res.channel) if res.channel else {}
    except ValueError:
        out = {}
    if not out:
        tail = "\n".join(scrub(res.stderr).strip().splitlines()[-8:])
        return {"ok": False, "error": f"the meta build ended ({res.status}) without a result: {tail}"}
    if not out.get("ok"):
        exc = out.get("exception") or {}
        out["error"] = scrub(f"{exc.get('type')}: {exc.get('message')}")
    return dict(out)


def main(argv: list[str] | None = None) -> int:
    from sandbox.harness.loading import go_offline

    go_offline()  # no network in a run: a Hub id fails at once and hub_offline builds it
    return child_main(run, _error, argv)


if __name__ == "__main__":
    sys.exit(main())
