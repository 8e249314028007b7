"""Classes: isolation (files, network, the rest of the workspace), secrets, resources and caps.
Each attack runs as the model's own code inside the harness, under bwrap and in process mode."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from sandbox.isolation.process import Limits, default_sandbox

from .conftest import needs_isolation

SECRET = "sk-npuport-test-secret-value-1234567890"


def _all_text(a) -> str:  # type: ignore[no-untyped-def]
    """Everything the run hands back: result, logs, notes (what reaches events, the report and the API)."""
    texts = [json.dumps(a.run.result), a.run.exec_result.stdout, a.run.exec_result.stderr,
             *a.run.exec_result.notes]
    texts += [p.read_text(errors="replace") for p in a.run.run_dir.glob("*.log")]
    texts.append((a.run.run_dir / "result.json").read_text())
    return "\n".join(texts)


def test_server_secrets_never_leave_the_run(attack, box, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", SECRET)
    steal = '''
def _steal():
    found = [repr(dict(os.environ))]
    for pid in (os.getppid(), 1):
        try:
            found.append(open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace"))
        except OSError as e:
            found.append(repr(e))
    return "\\n".join(found)
STOLEN = _steal()
print(STOLEN)
print(STOLEN, file=sys.stderr)
open("leak.txt", "w").write(STOLEN)
'''
    a = attack(steal, "raise RuntimeError(STOLEN)")
    assert not a.run.ok and a.run.result["exception"]["type"] == "RuntimeError"
    assert SECRET not in _all_text(a), "a server secret crossed out of the sandbox"
    if box.name == "bwrap":  # not even readable inside (process mode: only scrubbed on the way out)
        assert SECRET not in (a.run.run_dir / "leak.txt").read_text()
    assert a.original_untouched()


def test_registered_tokens_are_scrubbed(attack, box) -> None:  # type: ignore[no-untyped-def]
    """An API token the server holds (registered by JobManager.start) never comes back in run text,
    even when the model's code prints it (say it found it somewhere)."""
    from sandbox.isolation.process import register_secret

    token = "npuport-api-token-7f3a9c1e5b"
    register_secret(token)
    a = attack("", f"print({token!r}); raise ValueError('token=' + {token!r})")
    assert token not in _all_text(a) and "***" in a.run.exec_result.stdout


def test_text_leaving_the_run_is_capped(attack, box) -> None:  # type: ignore[no-untyped-def]
    a = attack("", "raise RuntimeError('x' * 5_000_000)")
    assert len(a.run.result["exception"]["message"]) <= 4_000
    assert len((a.run.run_dir / "result.json").read_text()) < 200_000


def test_home_and_host_files_are_not_readable(attack, box, tmp_path: Path,  # type: ignore[no-untyped-def]
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    needs_isolation(box)
    home = tmp_path / "server-home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    probe = f'''
def _probe():
    out = {{}}
    for p in ({str(home / ".ssh" / "id_rsa")!r}, {str(tmp_path / "work" / ".npuport-git" / "config")!r},
              {str(tmp_path / "user-model" / "config.json")!r}):
        try:
            out[p] = open(p).read()[:50]
        except OSError as e:
            out[p] = "denied: " + type(e).__name__
    return out
PROBE = _probe()
'''
    a = attack(probe, "print('PROBE', PROBE)")
    assert a.run.ok, a.run.result
    seen = a.run.exec_result.stdout
    assert SECRET not in seen and "***" not in seen
    assert seen.count("denied: ") == 3, seen


def test_writes_outside_the_run_folder_fail(attack, box, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs_isolation(box)
    targets = [tmp_path / "user-model" / "modeling_hostile.py", tmp_path / "work" / "model" / "modeling_hostile.py",
               tmp_path / "work" / ".npuport-git" / "config", tmp_path / "elsewhere.txt", Path("/usr/npuport-pwned")]
    code = f'''
def _write():
    n = []
    for p in {[str(t) for t in targets]!r}:
        try:
            with open(p, "a") as fh:
                fh.write("# pwned\\n")
            n.append(p)
        except OSError:
            pass
    return n
WROTE = _write()
'''
    a = attack(code, "print('WROTE', WROTE)")
    assert a.run.ok
    # /tmp inside the sandbox is a private tmpfs: a write there lands nowhere on the host
    assert a.run.exec_result.stdout.strip() in ("WROTE []", f"WROTE [{str(tmp_path / 'elsewhere.txt')!r}]")
    assert a.original_untouched()
    assert not (tmp_path / "elsewhere.txt").exists() and not Path("/usr/npuport-pwned").exists()


def test_reference_run_is_invisible_to_the_patched_run(attack, box, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needs_isolation(box)
    ref = tmp_path / "work" / "runs" / "reference"
    code = f'''
import glob
SEEN = glob.glob({str(ref)!r} + "/*") + glob.glob({str(tmp_path / "work" / "original")!r} + "/*")
'''
    # the reference run and the original exist before the port runs
    from .conftest import write_model

    ref.mkdir(parents=True)
    (ref / "result.json").write_text('{"outputs": {"tokens": [[1, 2, 3, 4]]}}')
    write_model(tmp_path / "work" / "original")
    a = attack(code, "print('SEEN', SEEN)")
    assert a.run.ok
    assert "SEEN []" in a.run.exec_result.stdout


def test_no_network(attack, box) -> None:  # type: ignore[no-untyped-def]
    needs_isolation(box)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    code = f'''
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
    NET = "connected"
except OSError as e:
    NET = "refused " + type(e).__name__
'''
    a = attack(code, "print('NET', NET)")
    srv.close()
    assert a.run.ok and "NET refused" in a.run.exec_result.stdout


def test_forged_result_file_and_early_exit_is_not_validated(attack, box) -> None:  # type: ignore[no-untyped-def]
    forged = json.dumps({"ok": True, "outputs": {"tokens": [[1, 2, 3, 4]], "digest": "x", "new_tokens": 4},
                         "timings": {"run_s": [0.001]}, "exception": None})
    a = attack("", f"open('result.json', 'w').write({forged!r})\nos._exit(0)")
    assert a.run.exec_result.returncode == 0
    assert not a.run.ok and a.run.status != "ok"
    assert a.run.result["exception"]["type"] == "ProcessDied"
    assert "without reporting a result" in a.run.result["exception"]["message"]
    assert json.loads((a.run.run_dir / "result.json").read_text())["ok"] is False  # the parent's, not the model's


def test_huge_token_result_is_refused(attack, box) -> None:  # type: ignore[no-untyped-def]
    a = attack("", "return torch.zeros((1, 2_000_000), dtype=torch.long)")
    assert not a.run.ok
    assert a.run.result["exception"]["type"] == "ResultTooLarge"


def test_stdout_flood_is_capped_and_said(attack, box) -> None:  # type: ignore[no-untyped-def]
    a = attack("", "sys.stdout.write('y' * (64 * 1024 * 1024)); sys.stdout.flush()")
    assert a.run.ok
    assert len(a.run.exec_result.stdout) <= 1024 * 1024
    assert any("stdout truncated" in n for n in a.run.exec_result.notes)


def test_setsid_daemon_dies_with_the_run(attack, box) -> None:  # type: ignore[no-untyped-def]
    # The daemon writes a heartbeat five times a second; once the run has ended it must stop changing.
    # (A fixed "sleep 2; touch" raced a run slowed by a loaded host: the touch could land before the end.)
    code = '''subprocess.Popen(["sh", "-c", "n=0; while true; do n=$((n+1)); echo $n > daemon-beat; sleep 0.2; done"],
                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
time.sleep(0.5)'''
    a = attack("import time", code)
    assert a.run.ok
    beat = a.run.run_dir / "daemon-beat"
    assert beat.exists(), "the daemon never started, so the test proves nothing"
    seen = beat.read_text()
    time.sleep(2)
    assert beat.read_text() == seen, "a setsid daemon outlived the run"


def test_grandchild_holding_the_pipes_does_not_turn_a_run_into_a_timeout(attack, box) -> None:  # type: ignore[no-untyped-def]
    code = 'subprocess.Popen(["sleep", "300"], start_new_session=True)'
    start = time.monotonic()
    a = attack("", code, Limits(wall_s=120))
    assert a.run.ok and a.run.status == "ok", a.run.result
    # far from the wall (120 s) and the sleep (300 s): a run waiting on the pipes' EOF would reach one of them;
    # a normal run takes ~10 s, ~21 s on a loaded 2-core host
    assert time.monotonic() - start < 80


def test_wall_time_holds_for_the_whole_tree(attack, box) -> None:  # type: ignore[no-untyped-def]
    code = ('subprocess.Popen(["sh", "-c", "sleep 4; touch late-child"], start_new_session=True)\n'
            "while True:\n    pass")
    start = time.monotonic()
    a = attack("", code, Limits(wall_s=3))
    assert a.run.status == "timeout" and a.run.result["exception"]["type"] == "Timeout"
    assert time.monotonic() - start < 15
    time.sleep(2)
    assert not (a.run.run_dir / "late-child").exists()


def test_process_count_is_capped_even_for_root(attack, box) -> None:  # type: ignore[no-untyped-def]
    code = '''
n = 0
kids = []
for _ in range(200):
    try:
        kids.append(subprocess.Popen(["sleep", "30"]))
        n += 1
    except OSError:
        break
print("FORKED", n)
for k in kids:
    k.kill()
    k.wait()  # reaped: a zombie still counts against the cap, and the model's torch needs its OpenMP threads
'''
    a = attack("", code, Limits(wall_s=60, max_procs=40))
    assert a.run.ok, (a.run.result, a.run.exec_result.stderr[-1500:])
    forked = int(a.run.exec_result.stdout.split("FORKED")[1].split()[0])
    assert forked < 40, f"{forked} processes started under a cap of 40"


def test_unisolated_runs_need_an_explicit_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox.isolation import process

    monkeypatch.setattr(process, "bwrap_available", lambda: None)
    monkeypatch.delenv("NPUPORT_ALLOW_UNISOLATED", raising=False)
    for name in ("NPUPORT_ISOLATION", "NPUPORT_SANDBOX"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(process.IsolationUnavailable):
        default_sandbox()
    assert default_sandbox(allow_process=True).name == "process"
    monkeypatch.setenv("NPUPORT_ISOLATION", "process")
    assert default_sandbox().name == "process"


def test_a_virtualenv_under_tmp_works_under_bwrap(tmp_path: Path) -> None:
    """bwrap gives the run a private /tmp: an interpreter living under /tmp must be bound back, or
    every run fails while the report says "isolation: bwrap"."""
    import site
    import subprocess
    import sys

    import yaml

    from agents.workspace import Workspace
    from sandbox.harness.runner import run_harness
    from sandbox.isolation.process import BubblewrapSandbox, bwrap_available
    from sandbox.targets import Target

    from .conftest import write_model

    bwrap = bwrap_available()
    if bwrap is None:
        pytest.skip("bubblewrap is not installed here")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    inner_site = subprocess.run([str(py), "-c", "import site; print(site.getsitepackages()[0])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    # the tmp venv borrows torch and npuport from ours (a .pth), as a layered environment does
    # (sys.path's, not only site.getsitepackages(): a venv layered on another reaches torch through a .pth)
    ours = [p for p in dict.fromkeys([*site.getsitepackages(), *sys.path]) if "site-packages" in p]
    (Path(inner_site) / "borrow.pth").write_text("\n".join([*ours, str(Path(__file__).resolve().parents[2])]) + "\n")
    original = write_model(tmp_path / "user-model")
    ws = Workspace.create(original, tmp_path / "work")
    manifest = yaml.safe_load((ws.model_dir / "npuport.yaml").read_text())
    run = run_harness(workdir=ws.root, model_dir=ws.model_dir, run_dir=ws.runs_dir / "port", manifest=manifest,
                      target=Target("cpu", "cpu"), sandbox=BubblewrapSandbox(bwrap), limits=Limits(wall_s=60),
                      python=str(py))
    assert run.exec_result.isolation == "bwrap"
    assert run.ok, (run.result, run.exec_result.stderr[-2000:])
    assert run.result["outputs"]["new_tokens"] == 4
