"""The in-sandbox harness: loads a model through its manifest entry, runs fixed inputs, and writes
a result JSON (outputs, timings it measured itself, warnings, op statistics, structured exception).

Run under the run's supervisor (sandbox/isolation/supervisor.py, which starts it through
sandbox/isolation/worker_channel.py's boot), or by hand as ``python -I -m sandbox.harness.worker SPEC.json``. The spec
is a ``HarnessSpec`` (sandbox/harness/spec.py). The model's code runs in this process, so nothing here is trusted with
the result: the supervisor holds the result pipe and the clock (each timed call below is bracketed for it);
what this process reports is the model process's claim. Contract: docs/architecture.md ("Harness contract").
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

from sandbox.harness.feeding import method_at, model_inputs_for, to_device
from sandbox.harness.hooks import bracket_steps, capture_hooks, profiler_for
from sandbox.harness.loading import (
    LoadedClass,
    bootstrap_target,
    exception_record,
    go_offline,
    load_class,
)
from sandbox.harness.model_build import _hub_offline, _load_attr, build_model, config_object, load_config
from sandbox.harness.spec import HarnessSpec
from sandbox.inputs.inputs_base import length_arguments, present_run_method
from sandbox.inputs.model_inputs import (  # one seeding for the harness, the bench and run.py
    marked_uninitialised,
    seed_parameters,
)
from sandbox.isolation import worker_channel


def new_token_count(row: list[int], input_ids: Any) -> int:
    """Tokens a generate call added: its row minus the prompt when the row starts with the prompt."""
    import torch

    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() == 0:
        return len(row)
    prompt = input_ids.reshape(-1, input_ids.shape[-1])[0].tolist()
    return len(row) - len(prompt) if row[:len(prompt)] == prompt else len(row)


def _digest_tokens(tokens: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def _record_output(outputs: dict[str, Any], output: Any, raw_inputs: dict[str, Any], outputs_path: str | None) -> None:
    """Greedy token ids (a generate call); else a forward's named floating outputs, saved at the spec's
    ``outputs_path`` for the validator (an encoder is validated on them, sandbox/inputs/run_outputs.py)."""
    from sandbox.inputs import run_outputs

    tokens = run_outputs.token_ids(output)
    tensors = run_outputs.named_outputs(output) if tokens is None else {}
    if tensors:
        kept = run_outputs.kept_for_comparison(tensors)
        outputs.update(tokens=None, tensors=run_outputs.describe(kept), digest=run_outputs.digest(kept), new_tokens=0)
        if outputs_path:
            import torch

            torch.save(kept, outputs_path)
        return
    if tokens is None:  # neither ids nor tensors (a custom generate's own structure): kept as it came
        tokens = output
    outputs["tokens"] = tokens
    outputs["digest"] = _digest_tokens(tokens)
    outputs["new_tokens"] = sum(new_token_count(row, raw_inputs.get("input_ids")) for row in tokens)


def synchronize(device: str) -> None:
    import torch

    if device.startswith("npu") and hasattr(torch, "npu"):
        torch.npu.synchronize()
    elif device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


@contextmanager
def _recorded_warnings() -> Iterator[Counter[str]]:
    """Every warning the model's code raises, counted by text, instead of printed."""
    counts: Counter[str] = Counter()
    original = warnings.showwarning

    def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        counts[f"{category.__name__}: {message}"] += 1

    warnings.showwarning = record  # type: ignore[assignment]
    warnings.simplefilter("default")
    try:
        yield counts
    finally:
        warnings.showwarning = original  # type: ignore[assignment]


def _build(spec: HarnessSpec, loaded: LoadedClass, result: dict[str, Any], counts: Counter[str]) -> tuple[Any, Any]:
    """The model on the run's device, built from the (shrunk, constructor-fitted) config with seeded weights."""
    import torch

    cls, model_dir = loaded.cls, loaded.model_dir
    config, shrunk = load_config(model_dir, spec.manifest, shrink=spec.shrink, overrides=spec.config_overrides,
                                 build=lambda c: loaded.call(lambda: build_model(cls, c, model_dir)),
                                 configure=lambda c: loaded.call(lambda: config_object(cls, c, model_dir)),
                                 run_config=spec.run_config)
    result["config_changes"] = shrunk
    if spec.shrink:
        result["shrunk"] = shrunk
        result["shrunk_config"] = config  # the bundle's run_config.json: the config the port ran with
    torch.manual_seed(spec.seed)
    with marked_uninitialised():  # torch.empty left as built is NaN, which seed_parameters then seeds
        model = loaded.call(lambda: build_model(cls, config, model_dir))
    from sandbox.harness.init_shapes import constructor_shapes, restore_constructor_shapes

    # a weight init that reshapes a parameter a checkpoint would not (it runs only for missing weights)
    shrunk += restore_constructor_shapes(model, constructor_shapes(cls, lambda: build_model(cls, config, model_dir)))
    if materialised := seed_parameters(model, spec.seed):
        result.setdefault("built_offline", []).append(
            "weights the model's code leaves on the meta device for its checkpoint to fill (built under "
            f"init_empty_weights: {', '.join(materialised)}) are materialised on the CPU and seeded like the rest")
    model.eval()
    floats = {p.dtype for p in model.parameters() if p.is_floating_point()}
    on_cpu = spec.redirect_to == "cpu" or spec.device == "cpu"
    if on_cpu and not spec.dtype and len(floats) > 1 and floats & {torch.float16, torch.bfloat16}:
        # parts built in half precision for a GPU, where the code autocasts only off the CPU (float input,
        # Half bias): a run on the CPU runs the whole model in float32
        model.float()
        counts["the model builds parts in " + "/".join(sorted(str(d).removeprefix("torch.") for d in floats))
               + " for a GPU; on the CPU it runs all in float32"] += 1
    if spec.dtype:
        model.to(getattr(torch, spec.dtype))
    model.to(spec.device)
    return model, config


def _timed_calls(method: Any, inputs: dict[str, Any], kwargs: dict[str, Any], spec: HarnessSpec,
                 result: dict[str, Any]) -> Any:
    """The warm-up and the timed calls, each bracketed for the supervisor's clock; the last call's output."""
    import torch

    output: Any = None
    worker_channel.ready()  # the supervisor's clock: load ends here, each call below is timed by it
    with torch.no_grad():
        for _ in range(spec.warmup):
            with worker_channel.timed("warmup"):
                method(**inputs, **kwargs)
                synchronize(spec.device)
        run_s, cpu_s = [], []
        for _ in range(max(1, spec.repeats)):
            with worker_channel.timed("run"):
                start, cpu0 = time.perf_counter(), time.process_time()
                output = method(**inputs, **kwargs)
                synchronize(spec.device)
                run_s.append(time.perf_counter() - start)
                cpu_s.append(time.process_time() - cpu0)  # CPU seconds: steadier than wall time on a busy host
    result["timings"]["run_s"] = run_s
    result["timings"]["run_cpu_s"] = cpu_s
    return output


def _call(spec: HarnessSpec, loaded: LoadedClass, bootstrap: ModuleType | None, model: Any, config: Any,
          result: dict[str, Any], t0: float) -> None:
    """Feed the model its inputs, call the run method with the hooks in place, and record what came out."""
    import torch

    manifest, forward_note = present_run_method(model, spec.manifest)
    run_cfg = manifest.get("run") or {}
    # decoding controls (greedy, N new tokens) mean nothing to a forward that stands in for a missing generate
    kwargs = {**(run_cfg.get("kwargs") or {}), **spec.run_kwargs} if forward_note is None else {}
    # before the inputs: a preprocessing path may run a tower itself (its output is in the inputs)
    coverage = coverage_recorder(model, config, loaded.model_dir, spec, result)
    raw_inputs, source_kwargs, result["inputs"] = model_inputs_for(model, manifest, loaded.model_dir, config,
                                                                   spec.seed, kwargs)
    if forward_note:
        result["inputs"]["notes"] = [forward_note, *(result["inputs"].get("notes") or [])]
    kwargs = {**source_kwargs, **kwargs}  # npuport's run kwargs (greedy, N new tokens) decide decoding
    inputs = {k: to_device(v, spec.device) for k, v in raw_inputs.items()}
    method = method_at(model, result["inputs"].get("method") or run_cfg.get("method", "generate"))
    kwargs = length_arguments(method, inputs, kwargs)  # a custom generate's own required length parameters
    if bootstrap is not None and hasattr(bootstrap, "begin_step"):
        bracket_steps(model, run_cfg.get("step"), bootstrap)
    captured: dict[str, Any] = {}
    handles = capture_hooks(model, list(spec.capture), captured, run_cfg.get("step"))
    profiler = profiler_for(spec.profile, model, loaded.model_dir, bootstrap, run_cfg.get("step"), spec.device)
    if profiler is not None:
        method = profiler.wrap(method)
    result["timings"]["load_s"] = time.perf_counter() - t0
    output = _timed_calls(method, inputs, kwargs, spec, result)
    for h in handles:
        h.remove()
    if coverage is not None:
        result["coverage"] = coverage.report()
    _record_output(result["outputs"], output, raw_inputs, spec.outputs_path)
    if spec.manifest.get("decode"):
        decode = _load_attr(spec.manifest["decode"], loaded.model_dir)
        result["outputs"]["text"] = [decode(config, row) for row in result["outputs"].get("tokens") or []]
    if profiler is not None:
        result["profile"] = profiler.report()
    if bootstrap is not None and hasattr(bootstrap, "op_report"):
        result["op_stats"] = bootstrap.op_report()  # before the captures travel to the host
    if captured and spec.capture_path:
        captured = {k: v.to("cpu", torch.float32) for k, v in captured.items()}
        torch.save(captured, spec.capture_path)
        result["outputs"]["capture_path"] = spec.capture_path
        result["outputs"]["captured"] = list(captured)  # in execution order


def coverage_recorder(model: Any, config: dict[str, Any], model_dir: Path, spec: HarnessSpec,
                      result: dict[str, Any]) -> Any:
    """The hooks that record which layers, towers and parts run (sandbox/harness/coverage.py); None, with the
    reason in the result, when the model's structure cannot be read: the run goes on without the record."""
    from sandbox.harness.coverage import CoverageRecorder, full_config_of

    try:
        return CoverageRecorder(model, config, full_config_of(model_dir, spec.manifest) if spec.shrink else None)
    except Exception as exc:  # noqa: BLE001  (a model's own module code raised while being read)
        result["coverage"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        return None


def _finish(result: dict[str, Any], offline: Any, bootstrap: ModuleType | None, counts: Counter[str],
            t0: float) -> None:
    if offline is not None and offline.notes:
        result["built_offline"] = [*offline.notes, *result.get("built_offline", [])]
    if bootstrap is not None and hasattr(bootstrap, "op_report") and not result["op_stats"]:
        try:
            result["op_stats"] = bootstrap.op_report()
        except Exception as exc:  # report the report's failure, keep the run's result
            result["op_stats"] = {"error": repr(exc)}
    result["warnings"] = [f"{msg} (x{n})" if n > 1 else msg for msg, n in counts.items()]
    result["timings"]["total_s"] = time.perf_counter() - t0


def run(spec: HarnessSpec) -> dict[str, Any]:
    import torch

    result: dict[str, Any] = {"ok": False, "outputs": {}, "timings": {}, "warnings": [], "op_stats": {},
                              "exception": None, "stubbed_modules": []}
    bootstrap: ModuleType | None = None
    offline: Any = None
    t0 = time.perf_counter()
    with _recorded_warnings() as counts:
        try:
            if spec.threads:
                torch.set_num_threads(spec.threads)
            bootstrap = bootstrap_target(spec.target)
            loaded = load_class(spec, stubbed=result["stubbed_modules"])
            offline = _hub_offline(loaded.model_dir, spec.manifest, spec.shrink)  # sub-models from the Hub, offline
            model, config = _build(spec, loaded, result, counts)
            _call(spec, loaded, bootstrap, model, config, result, t0)
            result["ok"] = True
        except BaseException as exc:  # the harness reports every failure as data
            result["exception"] = exception_record(exc, Path(spec.model_dir).resolve())
            # where the run's inputs came from (synthesised, the model's own path): the debugger's inputs class reads it
            result["exception"]["hints"]["inputs_source"] = str((result.get("inputs") or {}).get("source") or "")
        finally:
            _finish(result, offline, bootstrap, counts, t0)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = HarnessSpec.read(argv[0])
    go_offline()
    # The result goes to the run's supervisor (sandbox/isolation/supervisor.py) over the worker's channel, greeted
    # before any model code was imported; the result pipe to npuport is the supervisor's alone.
    channel = worker_channel.current() or worker_channel.connect()
    if spec.result_channel and channel is None:
        print("npuport harness: the spec asks for a supervisor channel but none was passed", file=sys.stderr)
        return 2
    result = run(spec)
    if channel is not None:
        channel.result(result)
    elif spec.result_path:  # run by hand, outside npuport's sandbox
        Path(spec.result_path).write_bytes(json.dumps(result, default=str).encode())
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
