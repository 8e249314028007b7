"""In-harness decode profile: what one ``generate`` call did, step by step, measured in the run that
produced the tokens (no extra model runs).

A step is one call of the manifest's step method, or of the model's top-level ``forward`` when the
manifest names none (each generate step calls it once). Per step: the length of its input along the
sequence axis, wall time, op count, host syncs and CPU fallbacks inside the step and in the loop body
after it (the "gap": stopping checks, sampling), their call sites in the model, the size of the cache
the step returned, and which submodules ran. Per generate: calls of every submodule down to depth 2
(an encoder that runs every step shows here) and tokenizer ``decode`` calls with their input length.

Counters: ascend-sim's own (ops, fallbacks, syncs with call sites); on the CPU only host reads
(``.item()``, ``.tolist()``, ...: each a sync on a device) — no op counts and no fallbacks there.
The analysis lives with the agents (agents/validation/perf_evidence.py); this module only measures (its counters:
sandbox/harness/profile_counters.py).
"""

from __future__ import annotations

import inspect
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from sandbox.harness.profile_counters import Counters, HostReadCounters, SimCounters, diff_sites, site_in

MAX_STEPS = 1024
MAX_MODULES = 64
MAX_DEPTH = 2  # submodules named with at most 1 dot ("model.vision_tower"): where encoders sit; deeper
# hooks (every layer's attention, MLP, norms) cost time on every step and add nothing to the rules
PAST_KWARGS = ("past_key_values", "past", "layer_past", "cache", "kv_cache")
SEQ_KWARGS = ("input_ids", "inputs_embeds", "hidden_states", "x")


def _seq_len(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    import torch

    for k in SEQ_KWARGS:
        v = kwargs.get(k)
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            return int(v.shape[1])
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() >= 2:
            return int(v.shape[1])
    return None


def _nbytes(obj: Any, depth: int = 0, seen: set[int] | None = None) -> int:
    """Bytes of the tensors held by a cache structure (tuples, lists, dicts, Cache objects)."""
    import torch

    seen = seen if seen is not None else set()
    if depth > 5 or id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, list | tuple):
        return sum(_nbytes(x, depth + 1, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(_nbytes(x, depth + 1, seen) for x in obj.values())
    if isinstance(obj, torch.nn.Module) or not hasattr(obj, "__dict__"):
        return 0
    return sum(_nbytes(x, depth + 1, seen) for x in vars(obj).values())


def _cache_of(out: Any) -> Any:
    """The cache a step returned: ``past_key_values`` of a dict / ModelOutput, else the tuple's tail."""
    if isinstance(out, dict):
        return out.get("past_key_values")
    if hasattr(out, "past_key_values"):
        return out.past_key_values
    if isinstance(out, tuple | list) and len(out) > 1:
        return tuple(out[1:])
    return None


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """Shapes, dtypes and scalars of a call's inputs (a hashable tuple, formatted only for the report):
    equal signatures in prefill and decode steps mean the module ignored the tokens decoded so far."""
    import torch

    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.shape, v.dtype
        if v is None or isinstance(v, bool | int | float | str):
            return v
        return type(v)

    return tuple(one(a) for a in args) + tuple((k, one(v)) for k, v in kwargs.items())


def _format_signature(sig: tuple[Any, ...] | None) -> str | None:
    import torch

    def one(v: Any) -> str:
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], torch.Size):
            return f"T{tuple(v[0])}{str(v[1])[6:]}"
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            return f"{v[0]}={one(v[1])}"
        return v.__name__ if isinstance(v, type) else repr(v)[:40]

    return None if sig is None else ",".join(one(v) for v in sig)


class DecodeProfiler:
    """Attach to a built model; wrap the run method with :meth:`wrap`; read :meth:`report`."""

    def __init__(self, model: Any, model_dir: str, bootstrap: ModuleType | None, step_method: str | None,
                 device: str) -> None:
        self.model = model
        self.root = model_dir.rstrip(os.sep) + os.sep
        self.step_method = step_method
        rt = getattr(bootstrap, "RT", None) if bootstrap is not None else None
        self.counters: Counters
        if rt is not None and hasattr(rt, "rec") and hasattr(rt, "count_ops"):
            self.counters = SimCounters(rt)
        elif device.startswith("cpu") or device.startswith("cuda"):  # cuda here is the reference redirect to cpu
            self.counters = HostReadCounters(self.root)
        else:
            self.counters = Counters()
        self.active = False
        self.error: str | None = None
        self.generate_calls = 0
        self.all_ms = [0.0, 0.0]  # the profiler's own time and generate time, over every generate call
        self._wrapped_tokenizers: set[int] = set()
        self._seen_modules: set[str] = set()
        self._reset()
        step_fn = getattr(model, step_method) if step_method else model.forward
        try:
            params = inspect.signature(step_fn).parameters
            self.takes_past = any(p in params for p in PAST_KWARGS)
        except (TypeError, ValueError):
            self.takes_past = False
        tf = sys.modules.get("transformers")
        self.transformers = getattr(tf, "__version__", None)
        self._hook_steps()
        self._hook_modules()

    # --- per-generate state -------------------------------------------------------------------
    def _reset(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.modules: dict[str, dict[str, Any]] = {}
        self.decode_calls: list[dict[str, Any]] = []
        self.step_site: str | None = None
        self.cur: dict[str, Any] | None = None
        self.prelude: dict[str, Any] = {}
        self.self_s = 0.0
        self.t_mark = time.perf_counter()
        self._snap()

    def _snap(self) -> None:
        c = self.counters
        self.m_ops, self.m_syncs, self.m_fb = c.ops(), c.syncs(), c.fallbacks()
        self.m_sync_sites = c.sync_sites()
        self.m_fb_sites = c.fallback_sites()

    def _window(self) -> dict[str, Any]:
        """Counts since the last mark, with the call sites of new syncs and fallbacks."""
        c = self.counters
        now = time.perf_counter()
        ops, syncs, fb = c.ops(), c.syncs(), c.fallbacks()
        out: dict[str, Any] = {"ms": (now - self.t_mark) * 1e3, "ops": ops - self.m_ops, "syncs": syncs - self.m_syncs,
                               "fallbacks": fb - self.m_fb}
        if syncs != self.m_syncs:
            s = c.sync_sites()
            out["sync_sites"] = diff_sites(s, self.m_sync_sites, self.root)
            self.m_sync_sites = s
        if fb != self.m_fb:
            f = c.fallback_sites()
            out["fallback_sites"] = diff_sites(f, self.m_fb_sites, self.root)
            self.m_fb_sites = f
        self.m_ops, self.m_syncs, self.m_fb, self.t_mark = ops, syncs, fb, now
        return out

    def _guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """A profiler error must never fail the model's run: record it and stop profiling."""

        def safe(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return None
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # measured data is optional, the run is not
                self.error = f"{type(exc).__name__}: {exc}"
                self.active = False
                return None
            finally:
                self.self_s += time.perf_counter() - start  # the profiler's own cost, reported

        return safe

    # --- steps ---------------------------------------------------------------------------------
    def _begin(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.cur is not None or len(self.steps) >= MAX_STEPS:
            return  # a nested call of the step (recursion) belongs to the outer step
        if self.steps:
            self.steps[-1]["gap"] = self._window()  # the loop body after the previous step
        else:
            self.prelude = self._window()  # generate before its first step (e.g. an image encoder)
        if self.step_site is None:
            self.step_site = site_in(self.root)
        past = None
        if self.takes_past:
            past = any(kwargs.get(k) is not None for k in PAST_KWARGS)
        self.cur = {"i": len(self.steps), "input_len": _seq_len(args, kwargs), "past_in": past, "calls": {}}

    def _end(self, out: Any) -> None:
        cur = self.cur
        if cur is None:
            return
        cur.update(self._window())
        cache = _cache_of(out)
        cur["cache_bytes"] = _nbytes(cache) if cache is not None else None
        self.steps.append(cur)
        self.cur = None

    def _hook_steps(self) -> None:
        begin, end = self._guard(self._begin), self._guard(self._end)
        if self.step_method:
            inner = getattr(self.model, self.step_method)

            def stepped(*args: Any, **kwargs: Any) -> Any:
                outer = self.cur is None
                if outer:
                    begin(args, kwargs)
                out = inner(*args, **kwargs)
                if outer:
                    end(out)
                return out

            setattr(self.model, self.step_method, stepped)  # instance attribute, like the harness's brackets
            return
        depth = {"n": 0}  # a forward that calls itself belongs to the outer step

        def pre(_m: Any, a: tuple[Any, ...], kw: dict[str, Any]) -> None:
            depth["n"] += 1
            if depth["n"] == 1:
                begin(a, kw)

        def post(_m: Any, _a: Any, _kw: Any, out: Any) -> None:
            depth["n"] = max(0, depth["n"] - 1)
            if depth["n"] == 0:
                end(out)

        self.model.register_forward_pre_hook(pre, with_kwargs=True)
        self.model.register_forward_hook(post, with_kwargs=True)

    # --- submodules ------------------------------------------------------------------------------
    def _hook_modules(self) -> None:
        import torch

        call = self._guard(self._module_call)
        containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)
        n = 0
        for name, sub in self.model.named_modules():
            if not name or name.count(".") >= MAX_DEPTH or isinstance(sub, containers):
                continue
            if n >= MAX_MODULES:
                break
            n += 1
            sub.register_forward_pre_hook(
                lambda m, a, kw, _n=name: call(_n, m, a, kw), with_kwargs=True)

    def _module_call(self, name: str, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rec = self.modules.get(name)
        if rec is None:
            rec = self.modules[name] = {"class": type(module).__name__, "calls": 0, "steps": [], "signatures": [],
                                        "site": None}
        rec["calls"] += 1
        step = self.cur["i"] if self.cur is not None else None
        if step is None or (rec["steps"] and rec["steps"][-1] == step):
            return
        rec["steps"].append(step)
        rec["signatures"].append(_signature(args, kwargs))
        self.cur["calls"][name] = 1  # type: ignore[index]
        if rec["site"] is None or step == 1:
            rec["site"] = site_in(self.root)

    # --- tokenizer decode ---------------------------------------------------------------------------
    def _hook_tokenizers(self) -> None:
        """Count ``decode`` calls of tokenizer-like classes (``encode`` + ``decode``) of the model's own
        modules and of transformers, when either is loaded: a stop check that decodes the whole output
        every step shows as one call per step whose input grows with the position."""
        classes: list[type] = []
        if len(sys.modules) == len(self._seen_modules):
            return  # nothing imported since the last scan
        fresh = sys.modules.keys() - self._seen_modules  # each generate scans only modules imported since
        self._seen_modules.update(fresh)
        for mod in [sys.modules[n] for n in fresh if n in sys.modules]:
            f = getattr(mod, "__file__", None) or ""
            if f.startswith(self.root):
                classes += [c for c in vars(mod).values()
                            if isinstance(c, type) and c.__module__ == mod.__name__
                            and callable(getattr(c, "decode", None)) and callable(getattr(c, "encode", None))]
        base = sys.modules.get("transformers.tokenization_utils_base")
        if base is not None and hasattr(base, "PreTrainedTokenizerBase"):
            classes.append(base.PreTrainedTokenizerBase)
        for cls in classes:
            for meth in ("decode", "batch_decode"):
                fn = cls.__dict__.get(meth)
                if fn is None or id(fn) in self._wrapped_tokenizers or not callable(fn):
                    continue
                wrapped = self._wrap_decode(fn)
                self._wrapped_tokenizers.add(id(wrapped))
                setattr(cls, meth, wrapped)

    def _wrap_decode(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        prof = self

        def decode(*args: Any, **kwargs: Any) -> Any:
            if not prof.active:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            prof._guard(prof._decode_call)(args, kwargs, (time.perf_counter() - start) * 1e3)
            return out

        decode.__wrapped__ = fn  # type: ignore[attr-defined]
        return decode

    def _decode_call(self, args: tuple[Any, ...], kwargs: dict[str, Any], ms: float) -> None:
        ids: Any = args[1] if len(args) > 1 else kwargs.get("token_ids", kwargs.get("ids"))
        n: int | None
        try:
            n = int(ids.numel()) if hasattr(ids, "numel") else len(ids)
        except TypeError:
            n = None
        self.decode_calls.append({"after_step": len(self.steps) - 1, "len": n, "ms": round(ms, 4),
                                  "site": site_in(self.root)})

    # --- the run method -----------------------------------------------------------------------------
    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def profiled(*args: Any, **kwargs: Any) -> Any:
            try:
                self._hook_tokenizers()
            except Exception as exc:  # same rule as _guard
                self.error = f"{type(exc).__name__}: {exc}"
            self.generate_calls += 1
            self._reset()
            self.active = self.error is None
            t0 = time.perf_counter()
            reads = self.counters if isinstance(self.counters, HostReadCounters) else None
            try:
                if reads is not None:
                    with reads:
                        out = method(*args, **kwargs)
                else:
                    out = method(*args, **kwargs)
            finally:
                if self.active and self.steps:
                    self._guard(lambda: self.steps[-1].__setitem__("gap", self._window()))()
                self.active = False
                self.total_ms = (time.perf_counter() - t0) * 1e3
                self.all_ms[0] += self.self_s * 1e3
                self.all_ms[1] += self.total_ms
            return out

        return profiled

    def report(self) -> dict[str, Any]:
        def rnd(d: dict[str, Any]) -> dict[str, Any]:
            return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}

        steps = []
        for s in self.steps:
            s = rnd(s)
            if isinstance(s.get("gap"), dict):
                s["gap"] = rnd(s["gap"])
            steps.append(s)
        modules = {}
        for name, rec in self.modules.items():
            modules[name] = {"class": rec["class"], "calls": rec["calls"], "steps": rec["steps"],
                             "constant_inputs": len(set(rec["signatures"])) <= 1, "site": rec["site"],
                             "signature": _format_signature(rec["signatures"][0] if rec["signatures"] else None)}
        return {"schema": 1, "counters": self.counters.kind, "step": self.step_method or "forward",
                "generate_calls": self.generate_calls, "total_ms": round(getattr(self, "total_ms", 0.0), 3),
                "profiler_ms": round(self.self_s * 1e3, 3),
                "all_generate_calls_ms": {"profiler": round(self.all_ms[0], 3), "generate": round(self.all_ms[1], 3)},
                "prelude": rnd(self.prelude), "steps": steps, "modules": modules,
                "decode_calls": self.decode_calls, "step_site": self.step_site, "takes_past": self.takes_past,
                "transformers": self.transformers, "error": self.error}
