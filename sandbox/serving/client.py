"""The vLLM side of the deployment check (runs inside the sandbox, in the vLLM environment): start the
bundle's own serve.sh on the servable folder, wait until it answers, send the token-check prompts (greedy,
through the OpenAI completions API), run the serving workload at each concurrency (output tok/s, TTFT,
TPOT, streamed), stop the server. Server and client share the sandbox's network namespace (loopback only:
bwrap's --unshare-net leaves the sandbox nothing else).

Run as ``python -I -m sandbox.serving.client SPEC.json``; the result goes to the result channel.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandbox.isolation.child_main import child_main

# A load at concurrency c is the first LOAD_WAVES x c requests of the workload (at least MIN_LOAD, at most all):
# a run of two waves spends half its time filling and draining the engine, ten waves measure its steady state.
# Transformers batched at c runs the same requests (sandbox/serving/reference.py), so each row stays like for like.
LOAD_WAVES = 10
MIN_LOAD = 48


_DIED = re.compile(r"(\S+) died unexpectedly \(exit code: (-?\d+)\)")
_NATIVE = re.compile(r'File "[^"]*/(csrc/[^"]+)", line (\d+), in (.+)$')
_RAISED = re.compile(r"\bERROR\b.*?\b([A-Za-z_.]*(?:Error|Exception)): (.+)$")
# What follows a dead engine rather than causes it.
_CONSEQUENCES = ("EngineDeadError", "RuntimeError: cancelled", "EngineGenerateError")


def root_cause(log: str) -> str:
    """The server log's first signs of why it failed, in a line: a worker that died (and by which signal), the
    first native frame of vLLM's own kernels on the crash's stack, the first error raised (not the dead
    engine's consequences). Empty when the log shows none."""
    died = native = raised = None
    in_source = False
    for line in log.splitlines():
        if died is None and (m := _DIED.search(line)):
            code = int(m.group(2))
            try:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            except ValueError:
                how = f"exit code {code}"
            died = f"vLLM's {m.group(1)} died ({how})"
        if (m := _NATIVE.search(line)) and not in_source and (native is None or not (
                m.group(1).endswith(".hpp") or m.group(3).startswith("operator"))):
            # the innermost frame, then (when that is a header) the first named function of a kernel's source file
            frame = f"{m.group(3).strip()[:100]} ({m.group(1)}:{m.group(2)})"
            native = f"in vLLM's native code {frame}" if native is None else f"{native} called from {frame}"
            in_source = not m.group(1).endswith(".hpp")
        if raised is None and (m := _RAISED.search(line)) and not any(c in line for c in _CONSEQUENCES):
            raised = f"{m.group(1)}: {m.group(2).strip()[:300]}"
    parts = [" ".join(p for p in (died, native) if p), raised and f"first error: {raised}"]
    return "; ".join(p for p in parts if p)


def load_at(requests: list[dict[str, Any]], concurrency: int) -> list[dict[str, Any]]:
    """The requests a load at ``concurrency`` serves (the workload's first LOAD_WAVES x concurrency)."""
    return requests[:max(MIN_LOAD, LOAD_WAVES * concurrency)]


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(json.loads(r.read()))


def _ready(base: str, proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bool, float]:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            return False, time.monotonic() - start
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    return True, time.monotonic() - start
        except OSError:
            time.sleep(1)
    return False, time.monotonic() - start


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """TERM the server's process group, KILL it after 30 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _completion(base: str, model: str, prompt: list[int], max_tokens: int, logprobs: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        body["logprobs"] = logprobs
        body["return_tokens_as_token_ids"] = True  # top-k keyed "token_id:N": no tokenizer needed to read them
    choice = _post(f"{base}/v1/completions", body, 300)["choices"][0]
    out: dict[str, Any] = {"tokens": choice.get("token_ids")}
    lp = choice.get("logprobs") or {}
    if lp.get("top_logprobs"):
        out["top_logprobs"] = [_by_id(row) for row in lp["top_logprobs"]]
    return out


def _by_id(row: dict[str, float] | None) -> dict[str, float]:
    """{token id (as a string, JSON's key type): logprob} of one position's top-k ("token_id:N" keys)."""
    out: dict[str, float] = {}
    for key, value in (row or {}).items():
        if key.startswith("token_id:") and value is not None:
            out[key.partition(":")[2]] = float(value)
    return out


def _messages(image: dict[str, Any]) -> list[dict[str, Any]]:
    """The image request as one user message: the test image, then the prompt text (which carries the
    model's own image placeholder, so the server adds none)."""
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image["image_data_url"]}},
                                         {"type": "text", "text": image["text"]}]}]


def _chat(base: str, model: str, image: dict[str, Any], max_tokens: int, logprobs: int | None) -> dict[str, Any]:
    """The image request through the chat API, greedy: the tokens, and the prompt ids the server built."""
    body: dict[str, Any] = {"model": model, "messages": _messages(image), "max_tokens": max_tokens, "temperature": 0,
                            "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        body.update(logprobs=True, top_logprobs=logprobs, return_tokens_as_token_ids=True)
    answer = _post(f"{base}/v1/chat/completions", body, 900)
    choice = answer["choices"][0]
    out: dict[str, Any] = {"tokens": choice.get("token_ids"), "prompt_ids": answer.get("prompt_token_ids")}
    rows = (choice.get("logprobs") or {}).get("content") or []
    if rows:
        out["top_logprobs"] = [_by_id({t["token"]: t["logprob"] for t in r.get("top_logprobs") or []}) for r in rows]
    return out


def _stream(base: str, model: str, req: dict[str, Any], image: dict[str, Any] | None = None) -> dict[str, Any]:
    """One streamed request: time to first token, time per output token after it, tokens received. With an
    image request, the request is that image and prompt with this request's output length."""
    body: dict[str, Any] = {"model": model, "max_tokens": req["max_tokens"], "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True}}
    if image is not None:
        body["messages"] = _messages(image)
    else:
        body["prompt"] = req["prompt"]
    route = "chat/completions" if image is not None else "completions"
    http = urllib.request.Request(f"{base}/v1/{route}", data=json.dumps(body).encode(),
                                  headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    first = None
    tokens = 0
    usage = None
    with urllib.request.urlopen(http, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("usage"):
                usage = chunk["usage"].get("completion_tokens")
            for choice in chunk.get("choices") or []:
                text = choice.get("text") or (choice.get("delta") or {}).get("content")
                n = len(choice.get("token_ids") or []) or (1 if text else 0)
                if n and first is None:
                    first = time.perf_counter()
                tokens += n
    end = time.perf_counter()
    tokens = usage if usage is not None else tokens
    ttft = (first or end) - start
    return {"ttft_s": ttft, "tpot_s": (end - (first or end)) / max(tokens - 1, 1), "tokens": tokens}


def _bench(base: str, model: str, requests: list[dict[str, Any]], concurrency: int,
           image: dict[str, Any] | None = None) -> dict[str, Any]:
    requests = load_at(requests, concurrency)
    _stream(base, model, requests[0], image)  # warm-up: the first request pays one-off costs
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(lambda r: _stream(base, model, r, image), requests))
    wall = time.perf_counter() - start
    tokens = sum(d["tokens"] for d in done)
    return {"concurrency": concurrency, "requests": len(requests), "output_tokens": tokens, "wall_s": round(wall, 3),
            "output_tokens_per_s": round(tokens / wall, 2),
            "median_ttft_ms": round(statistics.median(d["ttft_s"] for d in done) * 1000, 1),
            "median_tpot_ms": round(statistics.median(d["tpot_s"] for d in done) * 1000, 2)}


def backend_refusal(servable: Path) -> str | None:
    """Why vLLM's Transformers backend would refuse the servable folder's model class, else None: the question
    vLLM's registry asks (the class of config.json's first ``AutoModel*`` auto_map entry, else transformers'
    own class of that architecture; written for transformers' attention interface), asked in this env
    before a server is started for it."""
    import transformers

    cfg = json.loads((servable / "config.json").read_text())
    ref = next((v for k, v in (cfg.get("auto_map") or {}).items() if k.startswith("AutoModel")), None)
    arch = (cfg.get("architectures") or ["?"])[0]
    cls: Any = None
    try:
        if ref:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            cls = get_class_from_dynamic_module(ref, str(servable))
        else:
            cls = getattr(transformers, arch)
        if cls.is_backend_compatible() or cls._can_set_attn_implementation():
            return None
    except Exception as exc:  # the model's code under this env's transformers: its failure is the answer
        return (f"the model's class {ref or arch} does not load under vLLM's transformers {transformers.__version__} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})")
    return (f"vLLM's Transformers backend refuses {cls.__name__}: the class is not written for transformers' attention "
            f"interface (transformers {transformers.__version__}: is_backend_compatible() and "
            "_can_set_attn_implementation() are False)")


def progress(spec: dict[str, Any], text: str) -> None:
    """One line for the parent's live display (agents/deploy/sandboxed.py reads the file's last line)."""
    if spec.get("progress_path"):
        try:
            with open(spec["progress_path"], "a") as fh:
                fh.write(text.replace("\n", " ") + "\n")
        except OSError:
            pass


def run(spec: dict[str, Any]) -> dict[str, Any]:
    if spec.get("check_backend") and (why := backend_refusal(Path(spec["servable_dir"]))):
        return {"ok": False, "started": False, "no_path": why}
    port = int(spec["port"])
    base = f"http://127.0.0.1:{port}"
    log = Path(spec["log_path"])
    argv = ["bash", spec["serve_sh"], spec["servable_dir"], spec["serve_dir"], "--", "--port", str(port),
            *spec.get("extra_args", [])]
    env = {**os.environ, **(spec.get("env") or {})}
    out: dict[str, Any] = {"ok": False, "argv": argv, "started": False}
    progress(spec, "deployment: vLLM is starting (serve.sh)")
    with log.open("wb") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        up, waited = _ready(base, proc, float(spec.get("start_timeout_s", 300)))
        out["start_s"] = round(waited, 1)
        if not up:
            out["exit_code"] = proc.poll()
            text = log.read_text(errors="replace")
            out["cause"], out["error"] = root_cause(text), text[-3000:]
            return out
        out["started"] = True
        _check(spec, base, out)
        out["ok"] = True
    except (OSError, urllib.error.URLError, KeyError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}\n" + log.read_text(errors="replace")[-2000:]
    finally:
        stop_server(proc)
    if out.get("started") and not out["ok"]:  # the whole log now: a dying worker's lines may follow the reply
        out["cause"] = root_cause(log.read_text(errors="replace"))
    return out


def _check(spec: dict[str, Any], base: str, out: dict[str, Any]) -> None:
    """The token-check prompts, then the throughput at each concurrency while the budget lasts (``after_start_s``
    from the server's start: a concurrency that would start past it is left out, and ``cut`` says so)."""
    deadline = time.monotonic() + float(spec.get("after_start_s") or 1e9)
    model = spec["model_name"]
    image = spec.get("image_request")
    progress(spec, f"deployment: vLLM answered after {out['start_s']} s; tokens through the server")
    if image is not None:
        out["tokens"] = [_chat(base, model, image, int(spec["max_new_tokens"]), spec.get("logprobs"))]
    else:
        out["tokens"] = [_completion(base, model, p, int(spec["max_new_tokens"]), spec.get("logprobs"))
                         for p in spec["prompts"]]
    out["bench"] = []
    for c in spec.get("concurrencies") or []:
        if out["bench"] and time.monotonic() > deadline:
            out["cut"] = (f"throughput at concurrency {c} and above not measured: the check's budget "
                          f"({spec['after_start_s']:.0f} s after the start) was spent")
            break
        progress(spec, f"deployment: throughput {'probe ' if spec.get('probe') else ''}at concurrency {c}")
        out["bench"].append(_bench(base, model, spec["requests"], c, image))


def _error(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}


def main(argv: list[str] | None = None) -> int:
    return child_main(run, _error, argv)


if __name__ == "__main__":
    sys.exit(main())
