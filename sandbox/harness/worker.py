"""The in-sandbox harness: loads a model through its manifest entry, runs fixed inputs, and writes
a result JSON (outputs, timings it measured itself, warnings, op statistics, structured exception).

Run under the run's supervisor (sandbox/isolation/supervisor.py, which starts it through sandbox/isolation/worker_channel.py's
boot), or by hand as ``python -I -m sandbox.harness.worker SPEC.json``. The model's code runs in this process,
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

from sandbox.harness.model_build import (
    MODEL_PACKAGE,
    _hub_offline,
    _load_attr,
    build_model,
    load_config,
)
from sandbox.inputs.model_inputs import (  # one seeding for the harness, the bench and run.py
    marked_uninitialised,
    seed_parameters,
)
from sandbox.isolation import worker_channel

MAX_STUB_RETRIES = 8
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def _import_with_stubs(fn: Any, redirect: bool, stubbed: list[str]) -> Any:
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
    """The decode profile of the run (sandbox/harness/profile.py), unless the spec turns it off."""
    if not spec.get("profile", True):
        return None
    from sandbox.harness.profile import DecodeProfiler

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


def model_inputs_for(model: Any, manifest: dict[str, Any], model_dir: Path, config: dict[str, Any], seed: int,
                     run_kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(inputs, generate kwargs the inputs' source passed, {source, notes}): the manifest's inputs
    function, else the model's own preprocessing path, else inputs synthesised from the signature."""
    from sandbox.inputs.model_inputs import (
        PreprocessingFailed,
        capture_preprocessed,
        pixel_grid_names,
        synthesise_inputs,
        text_wrapper_language_model,
    )

    run_cfg = manifest.get("run") or {}
    if manifest.get("inputs"):
        return _load_attr(manifest["inputs"], model_dir)(config, seed), {}, \
            {"source": "hook", "notes": [f"inputs from {manifest['inputs']}(config, seed)"]}
    notes: list[str] = []
    if run_cfg.get("preprocess"):
        try:
            got = capture_preprocessed(model, run_cfg["preprocess"], model_dir, config, seed,
                                       max_new_tokens=int(run_kwargs.get("max_new_tokens") or 8))
            # a model that generates through a submodule (its language model): the run calls that generate
            return got.inputs, got.kwargs, {"source": "preprocess", "notes": got.notes,
                                            **({"method": got.method} if got.method else {})}
        except PreprocessingFailed as exc:
            notes = [f"the model's preprocessing path could not be driven ({exc}); inputs synthesised instead"]
    method = run_cfg.get("method", "generate")
    lm = text_wrapper_language_model(model, method)
    if lm:
        # the model's own generate takes text (generate(text, image)) and its preprocessing path could not be
        # driven: its language model generates on token ids, the part validated without the model's own path
        inputs = synthesise_inputs(model.get_submodule(lm), "generate", config, seed)
        notes.append(f"{type(model).__name__}.generate takes text, not token ids: the run calls its language model "
                     f"{lm}.generate ({type(model.get_submodule(lm)).__name__}) on synthesised ids ("
                     + ", ".join(sorted(inputs)) + "); the model's other inputs (an image) are not exercised")
        return inputs, {}, {"source": "synthesised", "notes": notes, "method": f"{lm}.generate"}
    inputs = synthesise_inputs(model, method, config, seed)
    notes.append("inputs synthesised from the run method's signature: " + ", ".join(sorted(inputs)))
    grids = pixel_grid_names(model, method)
    if grids:
        notes.append(f"the pixels are left out: {method} takes them with {', '.join(grids)} (packed patches and each "
                     "image's grid, a structure npuport does not guess); the text alone is run, so the vision tower "
                     "is not exercised (the model's own processor, or an npuport_inputs.py, would give both)")
    return inputs, {}, {"source": "synthesised", "notes": notes}


def _method(model: Any, path: str) -> Any:
    """``generate``, or a submodule's (``language_model.generate``) that the preprocessing path called."""
    obj = model
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def new_token_count(row: list[int], input_ids: Any) -> int:
    """Tokens a generate call added: its row minus the prompt when the row starts with the prompt."""
    import torch

    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() == 0:
        return len(row)
    prompt = input_ids.reshape(-1, input_ids.shape[-1])[0].tolist()
    return len(row) - len(prompt) if row[:len(prompt)] == prompt else len(row)


def _digest_tokens(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def _record_output(outputs: dict[str, Any], output: Any, raw_inputs: dict[str, Any], spec: dict[str, Any]) -> None:
    """Greedy token ids (a generate call); else a forward's named floating outputs, saved at the spec's
    ``outputs_path`` for the validator (an encoder is validated on them, sandbox/inputs/run_outputs.py)."""
    from sandbox.inputs import run_outputs

    tokens = run_outputs.token_ids(output)
    tensors = run_outputs.named_outputs(output) if tokens is None else {}
    if tensors:
        kept = run_outputs.kept_for_comparison(tensors)
        outputs.update(tokens=None, tensors=run_outputs.describe(kept), digest=run_outputs.digest(kept), new_tokens=0)
        if spec.get("outputs_path"):
            import torch

            torch.save(kept, spec["outputs_path"])
        return
    if tokens is None:  # neither ids nor tensors (a custom generate's own structure): kept as it came
        tokens = output
    outputs["tokens"] = tokens
    outputs["digest"] = _digest_tokens(tokens)
    outputs["new_tokens"] = sum(new_token_count(row, raw_inputs.get("input_ids")) for row in tokens)


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
    offline: Any = None
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
            from sandbox.cuda_redirect import redirect

            redirect.install(redirect_to)
        from sandbox.cuda_redirect.redirect import install_single_process_world

        install_single_process_world()  # one process: init_process_group makes a world of size 1 (hazard H9)
        sys.path.insert(0, str(model_dir))
        stubbed: list[str] = result["stubbed_modules"]
        redirect_on = bool(redirect_to)
        cls = _import_with_stubs(lambda: _load_attr(manifest["entry"]["class"], model_dir), redirect_on, stubbed)
        offline = _hub_offline(model_dir, manifest, spec)  # sub-models fetched from the Hub, built offline
        config, shrunk = load_config(model_dir, manifest, spec, lambda c: _import_with_stubs(
            lambda: build_model(cls, c, model_dir), redirect_on, stubbed))
        result["config_changes"] = shrunk
        if spec.get("shrink"):
            result["shrunk"] = shrunk
            result["shrunk_config"] = config  # the bundle's run_config.json: the config the port ran with
        torch.manual_seed(seed)
        with marked_uninitialised():  # torch.empty left as built is NaN, which seed_parameters then seeds
            model = _import_with_stubs(lambda: build_model(cls, config, model_dir), redirect_on, stubbed)
        from sandbox.harness.init_shapes import constructor_shapes, restore_constructor_shapes

        # a weight init that reshapes a parameter a checkpoint would not (it runs only for missing weights)
        shrunk += restore_constructor_shapes(model, constructor_shapes(cls, lambda: build_model(cls, config, model_dir)))
        if materialised := seed_parameters(model, seed):
            result.setdefault("built_offline", []).append(
                "weights the model's code leaves on the meta device for its checkpoint to fill (built under "
                f"init_empty_weights: {', '.join(materialised)}) are materialised on the CPU and seeded like the rest")
        model.eval()
        floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
        on_cpu = redirect_to == "cpu" or device == "cpu"
        if on_cpu and not spec.get("dtype") and len(floats) > 1 and floats & {torch.float16, torch.bfloat16}:
            # parts built in half precision for a GPU, where the code autocasts only off the CPU (float input,
            # Half bias): a run on the CPU runs the whole model in float32
            model.float()
            warning_counts["the model builds parts in " + "/".join(sorted(str(d).removeprefix("torch.")
                                                                           for d in floats))
                           + " for a GPU; on the CPU it runs all in float32"] += 1
        if spec.get("dtype"):
            model.to(getattr(torch, spec["dtype"]))
        model.to(device)
        run_cfg = manifest.get("run") or {}
        kwargs = dict(run_cfg.get("kwargs") or {})
        kwargs.update(spec.get("run_kwargs") or {})
        raw_inputs, source_kwargs, result["inputs"] = model_inputs_for(model, manifest, model_dir, config, seed, kwargs)
        kwargs = {**source_kwargs, **kwargs}  # npuport's run kwargs (greedy, N new tokens) decide decoding
        inputs = {k: _to_device(v, device) for k, v in raw_inputs.items()}
        method = _method(model, result["inputs"].get("method") or run_cfg.get("method", "generate"))
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
            run_s, cpu_s = [], []
            for _ in range(max(1, int(spec.get("repeats", 1)))):
                with worker_channel.timed("run"):
                    start, cpu0 = time.perf_counter(), time.process_time()
                    output = method(**inputs, **kwargs)
                    _synchronize(device)
                    run_s.append(time.perf_counter() - start)
                    cpu_s.append(time.process_time() - cpu0)  # CPU seconds: steadier than wall time on a busy host
        for h in handles:
            h.remove()
        result["timings"]["run_s"] = run_s
        result["timings"]["run_cpu_s"] = cpu_s
        _record_output(result["outputs"], output, raw_inputs, spec)
        if manifest.get("decode"):
            decode = _load_attr(manifest["decode"], model_dir)
            result["outputs"]["text"] = [decode(config, row) for row in result["outputs"].get("tokens") or []]
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
        if offline is not None and offline.notes:
            result["built_offline"] = [*offline.notes, *result.get("built_offline", [])]
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
    # A run has no network: the Hub libraries are told so before they are imported, so a model or processor
    # that names a Hub id fails at once (and sandbox/harness/hub_offline.py builds it) instead of retrying for minutes.
    for var in OFFLINE_ENV:
        os.environ.setdefault(var, "1")
    # The result goes to the run's supervisor (sandbox/isolation/supervisor.py) over the worker's channel, greeted
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
