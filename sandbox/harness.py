"""The in-sandbox harness: loads a model through its manifest entry, runs fixed inputs, and writes
a result JSON (outputs, timings it measured itself, warnings, op statistics, structured exception).

Run under the run's supervisor (sandbox/supervisor.py, which starts it through sandbox/worker_channel.py's
boot), or by hand as ``python -I -m sandbox.harness SPEC.json``. The model's code runs in this process,
so nothing here is trusted with the result: the supervisor holds the result pipe and the clock (each
timed call below is bracketed for it); what this process reports is the model process's claim.
Contract: docs/architecture.md ("Harness contract").
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

from sandbox import worker_channel
from sandbox.model_inputs import (  # one seeding for the harness, the bench and run.py
    marked_uninitialised,
    seed_parameters,
)

MAX_STUB_RETRIES = 8


MODEL_PACKAGE = "npuport_model"  # the synthetic package the model folder is imported as


def register_model_package(model_dir: Path) -> None:
    """Import the model folder as a package, as transformers' dynamic module loader does, so that its
    modules' relative imports (``from .configuration_x import XConfig``) resolve. Absolute imports
    still work through sys.path."""
    pkg = ModuleType(MODEL_PACKAGE)
    pkg.__path__ = [str(model_dir)]
    pkg.__file__ = str(model_dir / "__init__.py")
    pkg.__package__ = MODEL_PACKAGE
    sys.modules[MODEL_PACKAGE] = pkg


def _load_attr(spec: str, model_dir: Path) -> Any:
    module_name, _, attr = spec.partition(":")
    if not attr:
        module_name, _, attr = spec.rpartition(".")
    in_model = _module_in(model_dir, module_name)
    if in_model and MODEL_PACKAGE not in sys.modules:
        register_model_package(model_dir)
    module = importlib.import_module(f"{MODEL_PACKAGE}.{module_name}" if in_model else module_name)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _module_in(model_dir: Path, module_name: str) -> bool:
    base = model_dir / Path(*module_name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _import_with_stubs(fn: Any, redirect: bool, stubbed: list[str]) -> Any:
    """Call ``fn`` (an import); under the reference redirect, stub CUDA-only modules that the original
    imports unguarded and try again."""
    from sandbox import redirect as rd

    for _ in range(MAX_STUB_RETRIES):
        try:
            return fn()
        except ModuleNotFoundError as exc:
            root = (exc.name or "").split(".")[0]
            if not redirect or root not in rd.CUDA_ONLY_MODULES or root in stubbed:
                raise
            stubbed.append(root)
            rd.stub_module(exc.name or root)
            _forget_model_modules()
    return fn()


_model_dir_str = ""


def _forget_model_modules() -> None:
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if _model_dir_str and f.startswith(_model_dir_str) and name != MODEL_PACKAGE:
            del sys.modules[name]


def _frames(exc: BaseException, model_dir: Path) -> list[dict[str, Any]]:
    out = []
    for fs in traceback.extract_tb(exc.__traceback__):
        fname = fs.filename
        in_model = fname.startswith(str(model_dir))
        rel = os.path.relpath(fname, model_dir) if in_model else fname
        out.append({"file": rel, "line": fs.lineno or 0, "func": fs.name, "code": (fs.line or "").strip(),
                    "in_model": in_model})
    return out


def _bracket_steps(model: Any, step_method: str | None, bootstrap: ModuleType) -> None:
    """Per-step counters: bracket each call of the manifest's step method (one decode step), or each
    top-level forward when the manifest names none."""
    counter = {"n": 0}

    def begin() -> None:
        counter["n"] += 1
        bootstrap.begin_step(f"step-{counter['n']}")

    if step_method:
        inner = getattr(model, step_method)

        def stepped(*args: Any, **kwargs: Any) -> Any:
            begin()
            try:
                return inner(*args, **kwargs)
            finally:
                bootstrap.end_step()

        setattr(model, step_method, stepped)  # instance attribute: the class stays as written
        return
    model.register_forward_pre_hook(lambda _m, _a: begin())
    model.register_forward_hook(lambda _m, _a, _o: bootstrap.end_step())


MAX_CAPTURE_MODULES = 256
MAX_CAPTURE_BYTES = 256 * 1024 * 1024


def _capture_hooks(model: Any, names: list[str], captured: dict[str, Any], step_method: str | None) -> list[Any]:
    """Record the first output of named modules, in execution order, on the CPU in float32.
    "__step__" is the manifest's step method (or the model's forward); "*" is every submodule (capped)."""
    import torch

    budget = {"bytes": 0}

    def keep(name: str, out: Any) -> None:
        t = out[0] if isinstance(out, tuple | list) else out
        if name in captured or not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return
        size = t.numel() * 4
        if budget["bytes"] + size > MAX_CAPTURE_BYTES:
            return
        budget["bytes"] += size
        # A device-side copy: moving it to the host here would count as a host sync of the model.
        captured[name] = t.detach().clone()

    handles = []
    wanted = list(names)
    if "*" in wanted:
        wanted.remove("*")
        wanted += [n for n, _ in list(model.named_modules())[1:MAX_CAPTURE_MODULES]]
    for name in wanted:
        if name == "__step__":
            continue
        sub = model.get_submodule(name)
        handles.append(sub.register_forward_hook(lambda _m, _a, out, _n=name: keep(_n, out)))
    if "__step__" in names:
        if step_method:
            inner = getattr(model, step_method)

            def captured_step(*args: Any, **kwargs: Any) -> Any:
                out = inner(*args, **kwargs)
                keep("__step__", out)
                return out

            setattr(model, step_method, captured_step)
        else:
            handles.append(model.register_forward_hook(lambda _m, _a, out: keep("__step__", out)))
    return handles


def _profiler(spec: dict[str, Any], model: Any, model_dir: Path, bootstrap: ModuleType | None, step: str | None,
              device: str) -> Any:
    """The decode profile of the run (sandbox/profile.py), unless the spec turns it off."""
    if not spec.get("profile", True):
        return None
    from sandbox.profile import DecodeProfiler

    return DecodeProfiler(model, str(model_dir), bootstrap, step, device)


def _to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, list | tuple):  # e.g. images as a list of (crops, global view) tuples
        moved = [_to_device(v, device) for v in value]
        return type(value)(moved) if isinstance(value, list) or type(value) is tuple else type(value)(*moved)
    return value


def load_config(model_dir: Path, manifest: dict[str, Any], spec: dict[str, Any],
                build: Any = None) -> tuple[dict[str, Any], list[str]]:
    """config.json as a dict; under ``shrink`` a derived small config (sandbox/shrink.py) with the
    manifest's ``shrink:`` overrides on top, and the list of what was shrunk; with ``build`` (config ->
    model) the one the model's constructor accepts (sandbox/shrink_fit.py). Without ``shrink``, a
    config too large for this machine's memory is refused with a message naming --shrink."""
    from sandbox.cuda_only import kernel_flags_off
    from sandbox.shrink import estimate_params, shrink_config

    config: dict[str, Any] = json.loads((model_dir / manifest.get("config", "config.json")).read_text())
    flags = kernel_flags_off(config)  # "flash_attn": true names a kernel neither the CPU nor Ascend has
    changes: list[str] = []
    if spec.get("shrink") and build is not None:
        from sandbox.shrink_fit import fit_to_constructor

        small, changes = fit_to_constructor(build, config, manifest.get("shrink") or {}, model_dir,
                                            spec.get("config_overrides") or {})
        return small, [*flags, *changes]
    if spec.get("shrink"):
        config, changes = shrink_config(config, manifest.get("shrink") or {}, model_dir)
        changes = [*flags, *changes]
    else:
        changes = flags
        params = estimate_params(config)
        need = params * 4  # built in float32 before any dtype cast
        avail = _available_memory()
        if avail and need > 0.8 * avail:
            raise MemoryError(f"the model's config describes about {params / 1e9:.2f}B parameters "
                              f"({need / 2**30:.1f} GiB in float32) but {avail / 2**30:.1f} GiB of memory is "
                              "available: rerun with --shrink (a small config derived from config.json, random "
                              "weights)")
    config.update(spec.get("config_overrides") or {})
    return config, changes


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _auto_ref(value: Any) -> str | None:
    if isinstance(value, list | tuple):
        value = next((v for v in value if v), None)
    if not isinstance(value, str) or "." not in value:
        return None
    module, _, name = value.split("--", 1)[-1].rpartition(".")
    return f"{module}:{name}"


def build_model(cls: Any, config: dict[str, Any], model_dir: Path) -> Any:
    """Build the model as transformers does for remote code: the config through config.json's
    ``auto_map["AutoConfig"]`` (else the class's own ``config_class``) into its PretrainedConfig
    class, then ``cls._from_config``; a plain nn.Module gets the dict (``cls(config)``)."""
    auto = config.get("auto_map") if isinstance(config.get("auto_map"), dict) else {}
    ref = _auto_ref(auto.get("AutoConfig")) if auto else None
    config_cls: Any = _load_attr(ref, model_dir) if ref else None
    if config_cls is None:
        candidate = getattr(cls, "config_class", None)
        if isinstance(candidate, type) and hasattr(candidate, "from_dict"):
            config_cls = candidate
    if config_cls is None:
        return cls(config)
    config_obj = config_cls(**config)  # what PretrainedConfig.from_dict does with a dict
    if hasattr(cls, "_from_config"):
        return with_generation_mixin(cls)._from_config(config_obj)
    return cls(config_obj)


def with_generation_mixin(cls: Any) -> Any:
    """The class as transformers' Auto classes hand out remote code (``trust_remote_code=True``): a
    generative PreTrainedModel that relied on inheriting generate (it defines its own
    prepare_inputs_for_generation or generate) gets GenerationMixin among its bases, the way the model's
    authors loaded it (``auto_factory.add_generation_mixin_to_remote_model``, transformers >= 4.45)."""
    try:
        from transformers.models.auto.auto_factory import add_generation_mixin_to_remote_model
    except ImportError:  # older releases: PreTrainedModel itself inherits GenerationMixin
        return cls
    return add_generation_mixin_to_remote_model(cls)


def model_inputs_for(model: Any, manifest: dict[str, Any], model_dir: Path, config: dict[str, Any], seed: int,
                     run_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(inputs, generate kwargs the inputs' source passed, {source, notes}): the manifest's inputs
    function, else the model's own preprocessing path, else inputs synthesised from the signature."""
    from sandbox.model_inputs import PreprocessingFailed, capture_preprocessed_inputs, synthesise_inputs

    run_cfg = manifest.get("run") or {}
    if manifest.get("inputs"):
        return _load_attr(manifest["inputs"], model_dir)(config, seed), {}, \
            {"source": "hook", "notes": [f"inputs from {manifest['inputs']}(config, seed)"]}
    notes: list[str] = []
    if run_cfg.get("preprocess"):
        try:
            inputs, kwargs, notes = capture_preprocessed_inputs(
                model, run_cfg["preprocess"], model_dir, config, seed,
                max_new_tokens=int(run_kwargs.get("max_new_tokens") or 8))
            return inputs, kwargs, {"source": "preprocess", "notes": notes}
        except PreprocessingFailed as exc:
            notes = [f"the model's preprocessing path could not be driven ({exc}); inputs synthesised instead"]
    inputs = synthesise_inputs(model, run_cfg.get("method", "generate"), config, seed)
    notes.append("inputs synthesised from the run method's signature: " + ", ".join(sorted(inputs)))
    return inputs, {}, {"source": "synthesised", "notes": notes}


def new_token_count(row: list[int], input_ids: Any) -> int:
    """Tokens a generate call added: its row minus the prompt when the row starts with the prompt."""
    import torch

    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() == 0:
        return len(row)
    prompt = input_ids.reshape(-1, input_ids.shape[-1])[0].tolist()
    return len(row) - len(prompt) if row[:len(prompt)] == prompt else len(row)


def _digest_tokens(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def _synchronize(device: str) -> None:
    import torch

    if device.startswith("npu") and hasattr(torch, "npu"):
        torch.npu.synchronize()
    elif device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    global _model_dir_str
    import torch

    model_dir = Path(spec["model_dir"]).resolve()
    _model_dir_str = str(model_dir)
    device: str = spec["device"]
    seed = int(spec.get("seed", 0))
    manifest = spec["manifest"]
    result: dict[str, Any] = {"ok": False, "outputs": {}, "timings": {}, "warnings": [], "op_stats": {},
                              "exception": None, "stubbed_modules": []}
    warning_counts: Counter[str] = Counter()
    original_showwarning = warnings.showwarning

    def record_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        warning_counts[f"{category.__name__}: {message}"] += 1

    warnings.showwarning = record_warning  # type: ignore[assignment]
    warnings.simplefilter("default")
    bootstrap: ModuleType | None = None
    t0 = time.perf_counter()
    try:
        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        target = spec.get("target") or {}
        if target.get("bootstrap"):
            mod_name, _, fn_name = target["bootstrap"].partition(":")
            bootstrap = importlib.import_module(mod_name)
            getattr(bootstrap, fn_name)(target.get("options") or {})
        redirect_to = (spec.get("redirect") or "").partition("->")[2]
        if redirect_to:
            # After the target's bootstrap, so cuda can be redirected to its device.
            from sandbox import redirect

            redirect.install(redirect_to)
        from sandbox.redirect import install_single_process_world

        install_single_process_world()  # one process: init_process_group makes a world of size 1 (hazard H9)
        sys.path.insert(0, str(model_dir))
        stubbed: list[str] = result["stubbed_modules"]
        redirect_on = bool(redirect_to)
        cls = _import_with_stubs(lambda: _load_attr(manifest["entry"]["class"], model_dir), redirect_on, stubbed)
        config, shrunk = load_config(model_dir, manifest, spec, lambda c: _import_with_stubs(
            lambda: build_model(cls, c, model_dir), redirect_on, stubbed))
        result["config_changes"] = shrunk
        if spec.get("shrink"):
            result["shrunk"] = shrunk
            result["shrunk_config"] = config  # the bundle's run_config.json: the config the port ran with
        torch.manual_seed(seed)
        with marked_uninitialised():  # torch.empty left as built is NaN, which seed_parameters then seeds
            model = _import_with_stubs(lambda: build_model(cls, config, model_dir), redirect_on, stubbed)
        seed_parameters(model, seed)
        model.eval()
        if spec.get("dtype"):
            model.to(getattr(torch, spec["dtype"]))
        model.to(device)
        run_cfg = manifest.get("run") or {}
        kwargs = dict(run_cfg.get("kwargs") or {})
        kwargs.update(spec.get("run_kwargs") or {})
        raw_inputs, source_kwargs, result["inputs"] = model_inputs_for(model, manifest, model_dir, config, seed, kwargs)
        kwargs = {**source_kwargs, **kwargs}  # npuport's run kwargs (greedy, N new tokens) decide decoding
        inputs = {k: _to_device(v, device) for k, v in raw_inputs.items()}
        method = getattr(model, run_cfg.get("method", "generate"))
        if bootstrap is not None and hasattr(bootstrap, "begin_step"):
            _bracket_steps(model, run_cfg.get("step"), bootstrap)
        captured: dict[str, Any] = {}
        handles = _capture_hooks(model, spec.get("capture") or [], captured, run_cfg.get("step"))
        profiler = _profiler(spec, model, model_dir, bootstrap, run_cfg.get("step"), device)
        if profiler is not None:
            method = profiler.wrap(method)
        result["timings"]["load_s"] = time.perf_counter() - t0
        output: Any = None
        worker_channel.ready()  # the supervisor's clock: load ends here, each call below is timed by it
        with torch.no_grad():
            for _ in range(int(spec.get("warmup", 0))):
                with worker_channel.timed("warmup"):
                    method(**inputs, **kwargs)
                    _synchronize(device)
            run_s = []
            for _ in range(max(1, int(spec.get("repeats", 1)))):
                with worker_channel.timed("run"):
                    start = time.perf_counter()
                    output = method(**inputs, **kwargs)
                    _synchronize(device)
                    run_s.append(time.perf_counter() - start)
        for h in handles:
            h.remove()
        result["timings"]["run_s"] = run_s
        if isinstance(output, dict):
            output = output.get("tokens", output.get("sequences"))
        tokens = output.detach().to("cpu").tolist() if isinstance(output, torch.Tensor) else output
        result["outputs"]["tokens"] = tokens
        result["outputs"]["digest"] = _digest_tokens(tokens)
        result["outputs"]["new_tokens"] = sum(new_token_count(row, raw_inputs.get("input_ids")) for row in tokens)
        if manifest.get("decode"):
            decode = _load_attr(manifest["decode"], model_dir)
            result["outputs"]["text"] = [decode(config, row) for row in tokens]
        if profiler is not None:
            result["profile"] = profiler.report()
        if bootstrap is not None and hasattr(bootstrap, "op_report"):
            result["op_stats"] = bootstrap.op_report()  # before the captures travel to the host
        if captured and spec.get("capture_path"):
            captured = {k: v.to("cpu", torch.float32) for k, v in captured.items()}
            torch.save(captured, spec["capture_path"])
            result["outputs"]["capture_path"] = spec["capture_path"]
            result["outputs"]["captured"] = list(captured)  # in execution order
        result["ok"] = True
    except BaseException as exc:  # the harness reports every failure as data
        result["exception"] = {
            "type": type(exc).__name__,
            "message": str(exc),
            "frames": _frames(exc, model_dir),
            "traceback": "".join(traceback.format_exception(exc)),
        }
    finally:
        warnings.showwarning = original_showwarning  # type: ignore[assignment]
        if bootstrap is not None and hasattr(bootstrap, "op_report") and not result["op_stats"]:
            try:
                result["op_stats"] = bootstrap.op_report()
            except Exception as exc:  # report the report's failure, keep the run's result
                result["op_stats"] = {"error": repr(exc)}
        result["warnings"] = [f"{msg} (x{n})" if n > 1 else msg for msg, n in warning_counts.items()]
        result["timings"]["total_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(Path(argv[0]).read_text())
    # The result goes to the run's supervisor (sandbox/supervisor.py) over the worker's channel, greeted
    # before any model code was imported; the result pipe to npuport is the supervisor's alone.
    channel = worker_channel.current() or worker_channel.connect()
    if spec.get("result_channel") and channel is None:
        print("npuport harness: the spec asks for a supervisor channel but none was passed", file=sys.stderr)
        return 2
    result = run(spec)
    if channel is not None:
        channel.result(result)
    else:  # run by hand, outside npuport's sandbox
        Path(spec["result_path"]).write_bytes(json.dumps(result, default=str).encode())
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
