"""The in-sandbox benchmark: loads a model the way sandbox/harness/worker.py does (its functions, imported),
then, for each configuration in the spec, measures greedy generation at several concurrencies.

Run as ``python -I -m sandbox.bench.throughput SPEC.json``. The clock lives here, outside patched code.

Concurrency c means c requests arrive together; they are served in waves of at most ``batch`` rows
(one batched ``generate`` call per wave), request i built from seed ``seed + i``. Throughput is new
tokens / wall time of all waves; a request's latency is the time from the start until its wave ends.
Each (configuration, concurrency) point runs ``warmup`` untimed passes then ``repeats`` timed ones;
the result gives the median, min/max spread, and latency p50/p99 over all timed requests.

Configuration knobs (all optional): ``batch``, ``dtype`` (float32 | bfloat16 | float16),
``compile`` (none | default | reduce-overhead), ``threads``, ``attn`` (written to the config as
``_attn_implementation``). Any other knob is ``infeasible``: a knob the run cannot apply must not be
measured as if it had been. Each configuration's ``effects`` record what the run actually executed
(parameter dtype, threads, the attention implementation read back from the built model, compiled
modules, rows per call, and the aten ops of one untimed call), so a knob that changes nothing shows.
A configuration that cannot run is reported as ``infeasible`` (compile failures, unknown knobs) or
``error`` (anything else), with the message; a run whose first request's tokens differ from
``reference_tokens`` is ``mismatch``.

The parent side, sandbox/bench/runner.py ``run_bench``, writes the spec and runs this module in the sandbox.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from knowledge.errors import Infeasible
from sandbox.bench.measure import section_label
from sandbox.harness import model_build
from sandbox.harness.feeding import method_at, model_inputs_for, to_device
from sandbox.harness.loading import bootstrap_target, exception_record, frames, go_offline, load_class
from sandbox.harness.spec import BenchSpec
from sandbox.harness.worker import synchronize
from sandbox.inputs.inputs_base import length_arguments, present_run_method
from sandbox.inputs.model_inputs import cast_floats, marked_uninitialised, seed_parameters
from sandbox.isolation import worker_channel

DTYPES = ("float32", "bfloat16", "float16")
COMPILE_MODES = ("none", "default", "reduce-overhead")
KNOBS = ("id", "batch", "dtype", "compile", "threads", "attn")
NOT_KNOBS = ("id", "concurrencies")  # bookkeeping a configuration may carry


def new_token_counts(tokens: list[list[int]], prompts: list[list[int]] | None) -> list[int]:
    """New tokens per row: the row's length minus its prompt's when the row starts with that prompt
    (generate returned prompt + continuation), else the row's length (it returned the continuation)."""
    out = []
    for i, row in enumerate(tokens):
        prompt = prompts[i] if prompts and i < len(prompts) else []
        n = len(prompt)
        out.append(len(row) - n if n and len(row) >= n and list(row[:n]) == list(prompt) else len(row))
    return out


def _prompt_rows(inputs: dict[str, Any]) -> list[list[int]] | None:
    ids = inputs.get("input_ids")
    if ids is None or not hasattr(ids, "tolist") or getattr(ids, "dim", lambda: 0)() != 2:
        return None
    return [list(r) for r in ids.detach().to("cpu").tolist()]


def _op_counts(call: Any, inputs: dict[str, Any]) -> dict[str, int] | None:
    """aten ops of one call (what the knobs changed in the executed program); None where a dispatch
    mode cannot observe the run (the call is then made plainly)."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    counts: Counter[str] = Counter()

    class _Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            counts[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    try:
        with _Count():
            call(inputs)
    except Exception:
        call(inputs)
        return None
    return dict(sorted(counts.items()))


def _percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); exact for the small samples a benchmark has."""
    ordered = sorted(values)
    rank = max(1, int(-(-q * len(ordered) // 100)))  # ceil(q/100 * n), at least 1
    return ordered[min(rank, len(ordered)) - 1]


def _concat_requests(inputs_fn: Any, config: dict[str, Any], seed: int, n: int, device: str,
                     dtype: Any) -> dict[str, Any]:
    """A batch of n requests (seeds seed..seed+n-1) as one kwargs dict; copies of the first when the
    per-seed inputs do not stack (different prompt lengths)."""
    import torch

    per = [inputs_fn(config, seed + i) for i in range(n)]
    out: dict[str, Any] = {}
    for key, first in per[0].items():
        if isinstance(first, torch.Tensor):
            try:
                value = torch.cat([p[key] for p in per], dim=0)
            except RuntimeError:
                value = torch.cat([first] * n, dim=0)
            if value.is_floating_point() and dtype is not None:
                value = value.to(dtype)
            out[key] = value.to(device)
        else:  # nested inputs (a list of image tuples, a dict): the first request's, on the device
            out[key] = to_device(cast_floats(first, dtype), device)
    return out


def _compile_children(model: Any, mode: str) -> int:
    """torch.compile each direct child module (and each entry of a ModuleList child) in place: the
    model's own method (generate) keeps its Python control flow and calls compiled blocks."""
    import torch

    n = 0
    for child in model.children():
        if isinstance(child, torch.nn.ModuleList | torch.nn.ModuleDict):
            for sub in child.children():
                sub.compile(mode=mode)
                n += 1
        else:
            child.compile(mode=mode)
            n += 1
    return n


def _tokens_of(output: Any) -> list[list[int]]:
    import torch

    if isinstance(output, dict):
        output = output.get("tokens", output.get("sequences"))
    if isinstance(output, torch.Tensor):
        return output.detach().to("cpu").tolist()
    return list(output)


def _build_model(cls: Any, config: dict[str, Any], cfg: dict[str, Any], seed: int, device: str,
                 model_dir: Path) -> tuple[Any, Any]:
    import torch

    config = dict(config)
    if cfg.get("attn"):
        config["_attn_implementation"] = cfg["attn"]
    unknown = sorted(k for k in cfg if k not in KNOBS + NOT_KNOBS and cfg[k] is not None)
    if unknown:
        raise Infeasible(f"the benchmark cannot apply the knob(s) {unknown}: nothing in the run would change")
    dtype = None
    if cfg.get("dtype"):
        if cfg["dtype"] not in DTYPES:
            raise Infeasible(f"unknown dtype {cfg['dtype']!r}")
        dtype = getattr(torch, cfg["dtype"])
    torch.manual_seed(seed)
    with marked_uninitialised():
        model = model_build.build_model(cls, config, model_dir)
    seed_parameters(model, seed)
    model.eval()
    if dtype is not None:
        model.to(dtype)
    model.to(device)
    return model, dtype


def _measure_point(call: Any, inputs_fn: Any, config: dict[str, Any], seed: int, concurrency: int, batch: int,
                   device: str, dtype: Any, warmup: int, repeats: int,
                   effects: dict[str, Any] | None = None,
                   config_id: str = "") -> tuple[dict[str, Any], list[list[int]]]:
    waves = []
    for start in range(0, concurrency, batch):
        n = min(batch, concurrency - start)
        waves.append(_concat_requests(inputs_fn, config, seed + start, n, device, dtype))
    prompts = [_prompt_rows(w) for w in waves]
    first_tokens: list[list[int]] = []
    for k in range(warmup):
        for i, w in enumerate(waves):
            if k == 0 and i == 0 and effects is not None and "ops" not in effects:
                effects["ops"] = _op_counts(call, w)  # untimed: the first warm-up call
            else:
                call(w)
    synchronize(device)
    throughputs: list[float] = []
    latencies: list[float] = []
    new_tokens = 0
    for r in range(max(1, repeats)):
        new_tokens = 0
        t0 = time.perf_counter()
        for i, w in enumerate(waves):
            # each wave is timed by the run's supervisor; the counts travel with it as this process's claims
            with worker_channel.timed(section_label(config_id, concurrency, r, i)) as claims:
                tokens = _tokens_of(call(w))
                synchronize(device)
                counted = sum(new_token_counts(tokens, prompts[i]))
                claims.update(rows=len(tokens), new_tokens=counted)
            done = time.perf_counter() - t0
            latencies.extend([done] * len(tokens))
            new_tokens += counted
            if i == 0 and not first_tokens:
                first_tokens = tokens[:1]
        elapsed = time.perf_counter() - t0
        throughputs.append(new_tokens / elapsed if elapsed > 0 else 0.0)
    med = statistics.median(throughputs)
    point = {
        "concurrency": concurrency, "batch": batch, "waves": len(waves), "new_tokens": new_tokens,
        "counted": "new tokens (generated minus prompt)",
        "tokens_per_s": med, "tokens_per_s_runs": throughputs,
        "spread": (max(throughputs) - min(throughputs)) / med if med > 0 else 0.0,
        "latency_p50_s": _percentile(latencies, 50), "latency_p99_s": _percentile(latencies, 99),
    }
    return point, first_tokens


def _effects_of(model: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """What the configuration's knobs did to the built model (threads, rows per call, dtype, attention)."""
    import torch

    effects: dict[str, Any] = {"threads": torch.get_num_threads(), "rows_per_call": int(cfg.get("batch") or 1)}
    param = next((p for p in model.parameters() if p.is_floating_point()), None)
    effects["param_dtype"] = str(param.dtype).removeprefix("torch.") if param is not None else None
    model_config = getattr(model, "config", None)
    effects["attn"] = getattr(model_config, "_attn_implementation", None) if model_config is not None else None
    return effects


def _model_call(model: Any, manifest: dict[str, Any], model_dir: Path, base_config: dict[str, Any],
                spec: BenchSpec) -> tuple[Any, Any]:
    """(inputs_fn(config, seed), call(inputs)): the inputs the harness's runs got (hook, the model's
    preprocessing path, or synthesised), and the generate they go to (a submodule's, when the model
    generates through its language model)."""
    import torch

    manifest, forward_note = present_run_method(model, manifest)  # a class with no generate here runs forward
    run_cfg = manifest.get("run") or {}
    kwargs = dict(run_cfg.get("kwargs") or {}) if forward_note is None else {}
    kwargs.update(spec.run_kwargs if forward_note is None else {})
    _, source_kwargs, source = model_inputs_for(model, manifest, model_dir, base_config, spec.seed, kwargs)
    method = method_at(model, source.get("method") or run_cfg.get("method", "generate"))
    kwargs = {**source_kwargs, **kwargs}
    kwargs = length_arguments(method, {}, kwargs)  # a custom generate's own required length parameters

    def inputs_fn(config: dict[str, Any], seed: int) -> dict[str, Any]:
        return model_inputs_for(model, manifest, model_dir, config, seed, kwargs)[0]

    def call(inputs: dict[str, Any]) -> Any:
        with torch.no_grad():
            return method(**inputs, **kwargs)

    return inputs_fn, call


def _first_compile(call: Any, inputs: dict[str, Any], mode: str, config_id: str) -> float:
    """The first call compiles; a failure here (graph break storms, guard failures, missing compiler)
    makes the configuration infeasible on this host, not the model broken. Returns its seconds."""
    t1 = time.perf_counter()
    try:
        with worker_channel.timed(section_label(config_id, 0, 0, 0, "compile")):
            call(inputs)
    except Exception as exc:
        raise Infeasible(f"torch.compile(mode={mode!r}) failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
    return time.perf_counter() - t1


def _measure_config(out: dict[str, Any], cls: Any, base_config: dict[str, Any], manifest: dict[str, Any],
                    model_dir: Path, cfg: dict[str, Any], spec: BenchSpec, device: str) -> None:
    """Build the model for ``cfg`` and measure each concurrency into ``out`` (raises on a failure)."""
    import torch

    seed = spec.seed
    if cfg.get("threads"):
        torch.set_num_threads(int(cfg["threads"]))
    out["threads_used"] = torch.get_num_threads()
    t0 = time.perf_counter()
    model, dtype = _build_model(cls, base_config, cfg, seed, device, model_dir)
    out["load_s"] = time.perf_counter() - t0
    out["effects"] = effects = _effects_of(model, cfg)
    mode = cfg.get("compile") or "none"
    if mode not in COMPILE_MODES:
        raise Infeasible(f"unknown torch.compile mode {mode!r}")
    if mode != "none":
        out["compiled_modules"] = effects["compiled_modules"] = _compile_children(model, mode)
        effects["ops"] = None  # a dispatch mode would trace into the compiled graphs
    inputs_fn, call = _model_call(model, manifest, model_dir, base_config, spec)
    if mode != "none":
        first = _concat_requests(inputs_fn, base_config, seed, 1, device, dtype)
        out["compile_s"] = _first_compile(call, first, mode, str(out["id"]))
    batch = max(1, int(cfg.get("batch") or 1))
    for c in cfg.get("concurrencies") or spec.concurrencies or [1]:
        point, first_tokens = _measure_point(call, inputs_fn, base_config, seed, int(c), batch, device, dtype,
                                             spec.warmup, spec.repeats, effects, config_id=str(out["id"]))
        out["points"].append(point)
        out.setdefault("tokens", first_tokens)
    ref = spec.reference_tokens
    if ref is not None:
        out["tokens_match"] = out.get("tokens") == ref[:1]
        if not out["tokens_match"]:
            out["status"] = "mismatch"
            out["detail"] = f"first request's tokens {out.get('tokens')} differ from the reference {ref[:1]}"


def _run_config(cls: Any, base_config: dict[str, Any], manifest: dict[str, Any], model_dir: Path, cfg: dict[str, Any],
                spec: BenchSpec, device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"id": cfg.get("id", ""), "config": cfg, "status": "ok", "detail": "", "points": []}
    try:
        _measure_config(out, cls, base_config, manifest, model_dir, cfg, spec, device)
    except Infeasible as exc:
        out.update(status="infeasible", detail=str(exc))
    except Exception as exc:  # one configuration failing must not lose the others
        out.update(status="error", detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                   traceback="".join(traceback.format_exception(exc))[-4000:],
                   frames=frames(exc, model_dir))  # where in the model's code it failed
    return out


def run(spec: BenchSpec) -> dict[str, Any]:
    import torch

    model_dir = Path(spec.model_dir).resolve()
    result: dict[str, Any] = {"ok": False, "configs": [], "exception": None, "op_stats": {}, "stubbed_modules": [],
                              "host": {"cpu_count": os.cpu_count(), "torch": torch.__version__,
                                       "default_threads": torch.get_num_threads()}}
    bootstrap = None
    t0 = time.perf_counter()
    try:
        bootstrap = bootstrap_target(spec.target)
        loaded = load_class(spec, stubbed=result["stubbed_modules"])  # as the harness loads it
        # the same constructor-fitted small config as the port's runs (sandbox/harness/shrink_fit.py)
        config, _ = model_build.load_config(model_dir, spec.manifest, shrink=spec.shrink,
                                            overrides=spec.config_overrides,
                                            build=lambda c: loaded.call(lambda: model_build.build_model(
                                                loaded.cls, c, model_dir)),
                                            configure=lambda c: loaded.call(lambda: model_build.config_object(
                                                loaded.cls, c, model_dir)))
        for cfg in spec.configs:
            result["configs"].append(_run_config(loaded.cls, config, spec.manifest, model_dir, cfg, spec, spec.device))
        result["ok"] = True
    except BaseException as exc:  # the benchmark reports every failure as data
        record = exception_record(exc, model_dir)
        record["traceback"] = record["traceback"][-4000:]
        result["exception"] = record
    finally:
        if bootstrap is not None and hasattr(bootstrap, "op_report"):
            try:
                result["op_stats"] = bootstrap.op_report()
            except Exception as exc:
                result["op_stats"] = {"error": repr(exc)}
        result["total_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = BenchSpec.read(argv[0])
    go_offline()  # no network in a run (sandbox/harness/worker.py main)
    # The result goes to the run's supervisor (as the harness's does), which alone holds the pipe to the
    # parent and the clock; never through a file in the run folder.
    channel = worker_channel.current() or worker_channel.connect()
    result = run(spec)
    if channel is not None:
        channel.result(result)
    elif spec.result_path:  # run by hand, outside npuport's sandbox
        Path(spec.result_path).write_bytes(json.dumps(result, default=str).encode())
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
