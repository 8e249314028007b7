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

The parent side, :func:`run_bench`, writes the spec and runs this module in the sandbox.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knowledge.errors import Infeasible
from sandbox.bench.measure import measured_bench, section_label
from sandbox.harness import model_build
from sandbox.harness import worker as harness
from sandbox.harness.runner import HarnessRun, option_paths
from sandbox.inputs.model_inputs import cast_floats
from sandbox.isolation import worker_channel
from sandbox.isolation.process import (
    ExecResult,
    Limits,
    Mounts,
    Sandbox,
    default_sandbox,
    scrub,
    scrubbed_env,
)
from sandbox.isolation.rundir import discard, workspace_problem, write_own
from sandbox.isolation.supervised import decode, supervised_argv

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


def _concat_requests(inputs_fn: Any, config: dict[str, Any], seed: int, n: int, device: str, dtype: Any) -> dict[str, Any]:
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
            out[key] = harness._to_device(cast_floats(first, dtype), device)
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
    with harness.marked_uninitialised():
        model = model_build.build_model(cls, config, model_dir)
    harness.seed_parameters(model, seed)
    model.eval()
    if dtype is not None:
        model.to(dtype)
    model.to(device)
    return model, dtype


def _measure_point(call: Any, inputs_fn: Any, config: dict[str, Any], seed: int, concurrency: int, batch: int,
                   device: str, dtype: Any, warmup: int, repeats: int,
                   effects: dict[str, Any] | None = None, config_id: str = "") -> tuple[dict[str, Any], list[list[int]]]:
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
    harness._synchronize(device)
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
                harness._synchronize(device)
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


def _run_config(cls: Any, base_config: dict[str, Any], manifest: dict[str, Any], model_dir: Path, cfg: dict[str, Any],
                spec: dict[str, Any], device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"id": cfg.get("id", ""), "config": cfg, "status": "ok", "detail": "", "points": []}
    seed = int(spec.get("seed", 0))
    try:
        if cfg.get("threads"):
            torch.set_num_threads(int(cfg["threads"]))
        out["threads_used"] = torch.get_num_threads()
        t0 = time.perf_counter()
        model, dtype = _build_model(cls, base_config, cfg, seed, device, model_dir)
        out["load_s"] = time.perf_counter() - t0
        effects: dict[str, Any] = {"threads": torch.get_num_threads(), "rows_per_call": int(cfg.get("batch") or 1)}
        param = next((p for p in model.parameters() if p.is_floating_point()), None)
        effects["param_dtype"] = str(param.dtype).removeprefix("torch.") if param is not None else None
        model_config = getattr(model, "config", None)
        effects["attn"] = getattr(model_config, "_attn_implementation", None) if model_config is not None else None
        out["effects"] = effects
        mode = cfg.get("compile") or "none"
        if mode not in COMPILE_MODES:
            raise Infeasible(f"unknown torch.compile mode {mode!r}")
        if mode != "none":
            out["compiled_modules"] = effects["compiled_modules"] = _compile_children(model, mode)
            effects["ops"] = None  # a dispatch mode would trace into the compiled graphs
        run_cfg = manifest.get("run") or {}
        kwargs = dict(run_cfg.get("kwargs") or {})
        kwargs.update(spec.get("run_kwargs") or {})
        # the inputs the harness's runs got (hook, the model's preprocessing path, or synthesised), and the
        # generate they go to (a submodule's, when the model generates through its language model)
        _, source_kwargs, source = harness.model_inputs_for(model, manifest, model_dir, base_config, seed, kwargs)
        method = harness._method(model, source.get("method") or run_cfg.get("method", "generate"))
        kwargs = {**source_kwargs, **kwargs}

        def inputs_fn(config: dict[str, Any], seed: int) -> dict[str, Any]:
            return harness.model_inputs_for(model, manifest, model_dir, config, seed, kwargs)[0]

        def call(inputs: dict[str, Any]) -> Any:
            with torch.no_grad():
                return method(**inputs, **kwargs)

        if mode != "none":
            # The first call compiles; a failure here (graph break storms, guard failures, missing
            # compiler) makes the configuration infeasible on this host, not the model broken.
            t1 = time.perf_counter()
            try:
                with worker_channel.timed(section_label(str(out["id"]), 0, 0, 0, "compile")):
                    call(_concat_requests(inputs_fn, base_config, seed, 1, device, dtype))
            except Exception as exc:
                raise Infeasible(f"torch.compile(mode={mode!r}) failed: {type(exc).__name__}: {str(exc)[:300]}") from exc
            out["compile_s"] = time.perf_counter() - t1
        batch = max(1, int(cfg.get("batch") or 1))
        ref = spec.get("reference_tokens")
        for c in cfg.get("concurrencies") or spec.get("concurrencies") or [1]:
            point, first = _measure_point(call, inputs_fn, base_config, seed, int(c), batch, device, dtype,
                                          int(spec.get("warmup", 1)), int(spec.get("repeats", 3)), effects,
                                          config_id=str(out["id"]))
            out["points"].append(point)
            out.setdefault("tokens", first)
        if ref is not None:
            out["tokens_match"] = out.get("tokens") == ref[:1]
            if not out["tokens_match"]:
                out["status"] = "mismatch"
                out["detail"] = f"first request's tokens {out.get('tokens')} differ from the reference {ref[:1]}"
    except Infeasible as exc:
        out.update(status="infeasible", detail=str(exc))
    except Exception as exc:  # one configuration failing must not lose the others
        out.update(status="error", detail=f"{type(exc).__name__}: {str(exc)[:300]}",
                   traceback="".join(traceback.format_exception(exc))[-4000:],
                   frames=harness._frames(exc, model_dir))  # where in the model's code it failed
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    model_dir = Path(spec["model_dir"]).resolve()
    harness._model_dir_str = str(model_dir)  # lets the harness forget model modules when it stubs imports
    device: str = spec["device"]
    manifest = spec["manifest"]
    result: dict[str, Any] = {"ok": False, "configs": [], "exception": None, "op_stats": {},
                              "host": {"cpu_count": os.cpu_count(), "torch": torch.__version__,
                                       "default_threads": torch.get_num_threads()}}
    bootstrap = None
    t0 = time.perf_counter()
    try:
        redirect_on = spec.get("redirect") == "cuda->cpu"
        if redirect_on:
            from sandbox.cuda_redirect import redirect

            redirect.install()
        target = spec.get("target") or {}
        if target.get("bootstrap"):
            import importlib

            mod_name, _, fn_name = target["bootstrap"].partition(":")
            bootstrap = importlib.import_module(mod_name)
            getattr(bootstrap, fn_name)(target.get("options") or {})
        sys.path.insert(0, str(model_dir))
        stubbed: list[str] = []
        cls = harness._import_with_stubs(lambda: model_build._load_attr(manifest["entry"]["class"], model_dir),
                                         redirect_on, stubbed)
        # the same constructor-fitted small config as the port's runs (sandbox/harness/shrink_fit.py)
        config, _ = model_build.load_config(model_dir, manifest, spec, lambda c: harness._import_with_stubs(
            lambda: model_build.build_model(cls, c, model_dir), redirect_on, stubbed))
        result["stubbed_modules"] = stubbed
        for cfg in spec.get("configs") or [{"id": "default"}]:
            result["configs"].append(_run_config(cls, config, manifest, model_dir, cfg, spec, device))
        result["ok"] = True
    except BaseException as exc:  # the benchmark reports every failure as data
        result["exception"] = {"type": type(exc).__name__, "message": str(exc),
                               "frames": harness._frames(exc, model_dir),
                               "traceback": "".join(traceback.format_exception(exc))[-4000:]}
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
    spec = json.loads(Path(argv[0]).read_text())
    for var in harness.OFFLINE_ENV:  # no network in a run (sandbox/harness/worker.py main)
        os.environ.setdefault(var, "1")
    # The result goes to the run's supervisor (as the harness's does), which alone holds the pipe to the
    # parent and the clock; never through a file in the run folder.
    channel = worker_channel.current() or worker_channel.connect()
    result = run(spec)
    if channel is not None:
        channel.result(result)
    else:  # run by hand, outside npuport's sandbox
        Path(spec["result_path"]).write_bytes(json.dumps(result, default=str).encode())
    return 0 if result["ok"] else 1


# ----------------------------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------------------------


MAX_RESULT_BYTES = 8 * 1024 * 1024


@dataclass
class BenchRun(HarnessRun):
    """A harness run whose result is a benchmark (same fields and verdicts as any harness run)."""

    def error(self) -> str:
        exc = self.result.get("exception") or {}
        if exc:
            return f"{exc.get('type')}: {str(exc.get('message', ''))[:300]}"
        tail = "\n".join(self.exec_result.stderr.strip().splitlines()[-5:])
        return f"the benchmark process ended ({self.exec_result.status}, code {self.exec_result.returncode}): {tail}"


def run_bench(
    *,
    workdir: Path,
    model_dir: Path,
    run_dir: Path,
    manifest: dict[str, Any],
    configs: list[dict[str, Any]],
    device: str = "cpu",
    target: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    redirect: str | None = None,
    concurrencies: list[int] | None = None,
    warmup: int = 1,
    repeats: int = 3,
    seed: int = 0,
    reference_tokens: list[list[int]] | None = None,
    limits: Limits | None = None,
    sandbox: Sandbox | None = None,
    python: str | None = None,
    shrink: bool = False,
) -> BenchRun:
    """Run this module in the sandbox on ``model_dir`` for each configuration. ``redirect="cuda->cpu"``
    with ``device="cuda"`` runs the original as written (the baseline)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    result_path = (run_dir / "bench.json").resolve()
    spec = {
        "model_dir": str(model_dir.resolve()), "manifest": manifest, "device": device, "redirect": redirect,
        "target": target, "seed": seed, "configs": configs, "concurrencies": concurrencies or [1],
        "warmup": warmup, "repeats": repeats, "reference_tokens": reference_tokens, "result_path": str(result_path),
        "shrink": shrink,
    }
    spec_path = run_dir / "bench_spec.json"
    write_own(spec_path, json.dumps(spec, indent=1))
    discard(result_path)
    # The bench runs the model's code in a worker under the run's supervisor, which alone holds the result
    # pipe and the clock (sandbox/isolation/supervisor.py); the numbers are rebuilt from its timings here.
    argv = supervised_argv(python, "sandbox.bench.throughput", spec_path, MAX_RESULT_BYTES)
    box = sandbox or default_sandbox()
    # Under bwrap the run sees the model read-only and its run folder only (not npuport's git, not other runs).
    ro = [model_dir.resolve(), *option_paths((target or {}).get("options"))]  # npuport's caches only
    mounts = Mounts(hide=(workdir.resolve(),), ro=tuple(ro), rw=(run_dir.resolve(),),
                    interpreters=(python,) if python else ())
    # inductor compiles in the bench's own process: a pool of torch processes would read as the model's
    run_env = scrubbed_env({"TORCHINDUCTOR_COMPILE_THREADS": "1", **(env or {})})
    lim = limits or Limits()
    if full := workspace_problem(workdir, lim.workspace_quota_mb):  # the sum of every run folder of the port
        result = {"ok": False, "configs": [], "exception": {"type": "WorkspaceQuota", "message": full}}
        write_own(result_path, json.dumps(result, indent=1))
        return BenchRun(run_dir=run_dir, result=result, exec_result=ExecResult(
            returncode=None, status="killed", wall_s=0.0, stdout="", stderr="", isolation=box.name, notes=[full]))
    exec_result = box.execute(argv, cwd=run_dir.resolve(), env=run_env, limits=lim,
                              mounts=mounts, result_channel=True, channel_cap=MAX_RESULT_BYTES + 65536)
    write_own(run_dir / "bench_stdout.log", scrub(exec_result.stdout))
    write_own(run_dir / "bench_stderr.log", scrub(exec_result.stderr))
    sup = decode(exec_result)
    result: dict[str, Any] = {}
    if sup.unreadable == "too-large":
        result = {"ok": False, "configs": [], "exception": {"type": "BenchResultTooLarge",
                                                            "message": f"over {MAX_RESULT_BYTES} bytes"}}
    elif sup.unreadable:
        result = {"ok": False, "configs": [], "exception": {"type": "BenchResultUnreadable", "message": sup.unreadable}}
    elif sup.refused:
        result = {"ok": False, "configs": [], "exception": {
            "type": "UntrustedResult", "message": scrub(f"the supervisor refused the bench's result: {sup.refused}")}}
    elif sup.claims is not None:
        result = measured_bench(sup.claims, sup, reference_tokens)
    if not result:
        result = {"ok": False, "configs": [], "exception": None}
    result["supervisor"] = sup.note()
    write_own(result_path, json.dumps(result, indent=1, default=str))
    return BenchRun(run_dir=run_dir, exec_result=exec_result, result=result)


if __name__ == "__main__":
    sys.exit(main())
