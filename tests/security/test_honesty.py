"""Class: a run does not report on itself. The model's code runs in a worker process; the result pipe to
npuport and the clock belong to the run's supervisor (sandbox/isolation/supervisor.py). A model that writes a forged
result on every channel it can reach, freezes the clock, or has a reference-mode copy of itself speak for
the run must not change what npuport concludes: the result is refused, or the forgery is labelled as the
model process's claim and the supervisor's measure stands beside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from agents.workspace import Workspace
from sandbox.bench.runner import run_bench
from sandbox.isolation.process import Limits, Sandbox

from .conftest import write_model

MARK = "forged-by-the-model-7c1d"
FORGED_TOKENS = [[7, 7, 7, 7]]

# Writes a forged result on every pipe the model can open: its own (where the harness's result pipe was
# when the model shared its process), in the harness's format; its parent's and the run's first process's
# (where a supervisor's would be), in the supervisor's format.
FORGE_EVERYWHERE = f'''
def _forge():
    import json, stat
    harness = {{"ok": True, "outputs": {{"tokens": {FORGED_TOKENS!r}, "digest": "x", "new_tokens": 4}},
               "timings": {{"load_s": 0.0, "run_s": [4.2e-07], "total_s": 0.001}}, "exception": None,
               "configs": [{{"id": "t", "status": "ok", "points": [{{"concurrency": 1, "tokens_per_s": 1e9}}]}}],
               "forged": {MARK!r}}}
    sup = {{"supervisor": {{"load_s": 0.0, "total_s": 0.001, "findings": [], "processes": [], "forged": {MARK!r},
                           "sections": [{{"label": "run", "s": 4.2e-07, "claims": {{}}}}], "worker_exit": 0}},
           "claims": harness}}
    wrote = []
    for pid in dict.fromkeys(["self", str(os.getppid()), "1"]):
        try:
            names = os.listdir(f"/proc/{{pid}}/fd")
        except OSError:
            continue
        for n in names:
            path = f"/proc/{{pid}}/fd/{{n}}"
            try:
                if int(n) <= 2 or not stat.S_ISFIFO(os.stat(path).st_mode):
                    continue
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except (OSError, ValueError):
                continue
            try:
                os.write(fd, json.dumps(harness if pid == "self" else sup).encode())
                wrote.append(path)
            except OSError:
                pass
            os.close(fd)
    print("FORGED INTO", wrote)
    return wrote
'''


def _forged(result: dict) -> bool:  # type: ignore[type-arg]
    return MARK in json.dumps({k: v for k, v in result.items() if k not in ("timings_claimed",)}) and \
        result.get("outputs", {}).get("tokens") == FORGED_TOKENS


def test_the_result_channel_is_out_of_the_models_reach(attack, box: Sandbox) -> None:  # type: ignore[no-untyped-def]
    """The model writes a glowing result on every pipe and socket it can open, then exits: nothing it
    wrote becomes the run's result."""
    if box.name == "process" and os.geteuid() == 0:
        pytest.skip("process mode as root: root may open any process's fds; bwrap (or a service user) holds this")
    a = attack(FORGE_EVERYWHERE, "_forge()\nos._exit(0)")
    assert not a.run.ok, a.run.result
    assert not _forged(a.run.result), a.run.result
    assert "forged" not in json.dumps(a.run.result.get("supervisor") or {})


def test_the_clock_is_the_supervisors(attack, box: Sandbox) -> None:  # type: ignore[no-untyped-def]
    """A model that freezes every clock of its process and then takes 0.6 s per call: the run's timings are
    the supervisor's (0.6 s or more), the model's frozen figures only kept as its claim."""
    freeze = '''
import time as _t
_real_sleep = _t.sleep
for _name in ("perf_counter", "monotonic", "time", "process_time"):
    setattr(_t, _name, lambda: 1000.0)
'''
    a = attack(freeze, "_real_sleep(0.6)")
    assert a.run.ok, a.run.result
    timings = a.run.result["timings"]
    assert timings["measured_by"] == "supervisor"
    assert timings["run_s"] and timings["run_s"][0] >= 0.55, timings
    assert timings["total_s"] >= timings["run_s"][0]
    assert a.run.result["timings_claimed"]["run_s"] == [0.0]  # what the model's own clock said, kept as a claim
    prov = a.run.result["provenance"]
    assert "timings" in prov["measured_by_supervisor"] and "outputs" in prov["claimed_by_model_process"]


def _copy_spec() -> str:
    """Code (in the model) that writes a reference-mode copy of the run's spec: the original on the CPU
    under the cuda->cpu redirect, which the target run would never be."""
    return '''
import json as _json
_spec = _json.load(open("spec.json"))
_spec.update(device="cuda", redirect="cuda->cpu", target=None, result_path="copy-result.json",
             result_channel=False)
_json.dump(_spec, open("copy-spec.json", "w"))
_env = dict(os.environ, NPUPORT_COPY="1")
_chans = []
for _fd in range(3, 256):
    try:
        os.set_inheritable(_fd, True)
        _chans.append(_fd)
    except OSError:
        pass
_inner = os.environ.get("HARNESS_RESULT_FD") or _ORIG_FD
if _inner:
    _env["HARNESS_RESULT_FD"] = _inner
_sock = [f for f in _chans if f not in (0, 1, 2)]
if _WORKER_FD:
    _env["SANDBOX_WORKER_FD"] = _WORKER_FD
_argv = [sys.executable, "-I", "-B", "-u", "-m", "sandbox.harness.worker", "copy-spec.json"]
'''


# At import: remember the channel numbers the runner announced (the old harness popped its variable only
# in main, before importing the model: the fd stays open, its number is in /proc/self/fd).
CAPTURE_FDS = '''
import stat as _stat
def _chan_fds(kind):
    out = []
    for _n in os.listdir("/proc/self/fd"):
        try:
            _m = os.stat(f"/proc/self/fd/{_n}").st_mode
        except OSError:
            continue
        if int(_n) > 2 and kind(_m):
            out.append(_n)
    return out
_pipes = sorted(_chan_fds(_stat.S_ISFIFO), key=int)
_socks = sorted(_chan_fds(_stat.S_ISSOCK), key=int)
_ORIG_FD = _pipes[0] if _pipes else ""
_WORKER_FD = _socks[0] if _socks else ""
'''


@pytest.mark.parametrize("how", ["exec", "child-speaks", "child-computes"])
def test_a_reference_mode_copy_cannot_speak_for_the_run(attack, box: Sandbox, how: str) -> None:  # type: ignore[no-untyped-def]
    """A model that cannot run on the target (its generate fails there) runs a copy of the harness in
    reference mode and has that copy's result stand for the run: by replacing itself with the copy
    (exec), by letting the copy write the run's channels, or by returning the copy's tokens as its own.
    Each is refused: the run is not ok."""
    if how == "exec":
        act = "os.execve(sys.executable, _argv, _env)"
    elif how == "child-speaks":
        act = "subprocess.run(_argv, env=_env, pass_fds=_chans)\nos._exit(0)"
    else:  # the copy writes its result to a file; the model returns the copy's tokens from its own generate
        act = ('_env.pop("HARNESS_RESULT_FD", None); _env.pop("SANDBOX_WORKER_FD", None)\n'
               'subprocess.run(_argv, env=_env, pass_fds=())\n'
               'return torch.tensor(_json.load(open("copy-result.json"))["outputs"]["tokens"])')
    in_generate = ('if os.environ.get("NPUPORT_COPY") != "1":\n'
                   + "\n".join("    " + line for line in (_copy_spec() + act).splitlines()) + "\n"
                   + "    raise NotImplementedError('this model cannot run on the target')")
    a = attack(CAPTURE_FDS, in_generate, Limits(wall_s=120))
    assert not a.run.ok, ("a reference-mode copy spoke for the run", a.run.result.get("outputs"),
                          a.run.exec_result.stderr[-1500:])
    exc = a.run.result.get("exception") or {}
    assert exc.get("type") in ("UntrustedResult", "NotImplementedError", "ProcessDied"), exc


def _bench(tmp_path: Path, box: Sandbox, at_import: str, in_generate: str):  # type: ignore[no-untyped-def]
    original = write_model(tmp_path / "user-model", at_import, in_generate)
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    return run_bench(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / "bench", manifest=manifest,
                     configs=[{"id": "t", "batch": 1}], warmup=0, repeats=2, limits=Limits(wall_s=120), sandbox=box)


def test_the_tuners_bench_speed_is_the_supervisors(tmp_path: Path, box: Sandbox) -> None:
    """The bench's own clock runs 1000x slow in the model's process (any speed it likes) and each call
    takes 0.2 s: the throughput npuport uses is the supervisor's (at most 4 tokens / 0.2 s)."""
    slow_clock = '''
import time as _t
_real_pc, _real_sleep = _t.perf_counter, _t.sleep
_t.perf_counter = lambda: _real_pc() / 1000.0
'''
    run = _bench(tmp_path, box, slow_clock, "_real_sleep(0.2)")
    assert run.ok, run.error()
    c = run.result["configs"][0]
    assert c["status"] == "ok", c
    pt = c["points"][0]
    assert pt["measured_by"] == "supervisor"
    assert pt["new_tokens"] == 4 and 0 < pt["tokens_per_s"] <= 4 / 0.2 * 1.1, pt
    assert pt["claimed_by_model_process"]["tokens_per_s"] > 1000, pt  # the lie, kept as the model's claim


def test_a_bench_that_forges_its_result_is_refused(tmp_path: Path, box: Sandbox) -> None:
    """The bench's model writes a forged bench result on every channel it can reach and exits."""
    if box.name == "process" and os.geteuid() == 0:
        pytest.skip("process mode as root: root may open any process's fds; bwrap (or a service user) holds this")
    run = _bench(tmp_path, box, FORGE_EVERYWHERE, "_forge()\nos._exit(0)")
    assert not run.ok or not run.result.get("configs"), run.result
    assert MARK not in json.dumps(run.result)
