"""Batch mode without Ray: the manifest, the store's exactly-once transitions (real SQLite), the
results table, the CLI's answer when Ray is missing, and a local-executor batch with a hanging model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from graph.batch.manifest import load_manifest
from graph.batch.store import BatchStore
from knowledge.errors import BatchManifestError
from tests.batch_models import write_zoo
from tests.conftest import REPO_ROOT
from tests.tiny_models import write_tiny_model


def test_manifest_defaults_overrides_and_stable_id(tmp_path: Path) -> None:
    manifest = write_zoo(tmp_path)
    a = load_manifest(manifest)
    assert [p.key for p in a.ports] == ["alpha", "beta", "gamma"]
    assert [p.kind for p in a.ports] == ["folder", "archive", "folder"]
    beta = a.ports[1].settings
    assert beta.target == "cpu" and beta.shrink is True
    assert beta.budget.max_runs == 2 and beta.budget.run_timeout_s == 180
    assert a.ports[0].settings.shrink is False
    assert load_manifest(manifest).batch_id == a.batch_id  # same content, same batch: re-running resumes it
    assert load_manifest(manifest, {"chip": "a3"}).batch_id != a.batch_id
    # a folder of model folders and archives is a batch too
    d = load_manifest(tmp_path, {"target": "cpu"})
    assert {p.key for p in d.ports} >= {"alpha", "beta", "gamma"}


@pytest.mark.parametrize(("body", "needle"), [
    ("models:\n  - path: alpha\n    target: tpu\n", "models.0.target"),
    ("models:\n  - path: nowhere\n", "does not exist"),
    ("models:\n  - path: alpha\n  - path: alpha\n", "two models are named 'alpha'"),
    ("defaults: {budget: {max_runs: 0}}\nmodels:\n  - path: alpha\n", "defaults.budget.max_runs"),
    ("models: []\n", "models"),
    ("models:\n  - path: alpha\n    colour: red\n", "colour"),
    ("- just a list\n", "must be a mapping"),
])
def test_manifest_errors_say_where(tmp_path: Path, body: str, needle: str) -> None:
    write_tiny_model(tmp_path / "alpha")
    (tmp_path / "b.yaml").write_text(body)
    with pytest.raises(BatchManifestError) as exc:
        load_manifest(tmp_path / "b.yaml")
    assert needle in str(exc.value)


def _store_with_port(tmp_path: Path) -> BatchStore:
    store = BatchStore(tmp_path / "b.sqlite")
    store.ensure_batch("b1", "b", "me", {}, str(tmp_path), [("m", {"key": "m"})])
    return store


def test_claims_are_exclusive_and_results_written_once(tmp_path: Path) -> None:
    store = _store_with_port(tmp_path)
    other = BatchStore(tmp_path / "b.sqlite")  # a second process's connection
    # two claims racing (the driver lock keeps a second driver out; this checks the store on its own):
    # each claim that succeeds supersedes the one before, and only the port's current attempt may run
    wins: list[object] = []
    barrier = threading.Barrier(2)

    def take(s: BatchStore) -> None:
        barrier.wait()
        wins.append(s.claim("b1", "m"))

    ts = [threading.Thread(target=take, args=(s,)) for s in (store, other)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    claims = [c for c in wins if c is not None]
    assert claims and len(store.attempts("b1", "m")) == len(claims)
    row = store.port("b1", "m")
    assert row is not None and row.status == "running"
    current = row.attempt_id
    assert current in {c.attempt_id for c in claims}  # type: ignore[attr-defined]
    # only the current attempt may begin and complete; the port's result is written once
    stale = [c for c in claims if c.attempt_id != current]  # type: ignore[attr-defined]
    for c in stale:
        assert not store.begin(c.attempt_id, os.getpid())  # type: ignore[attr-defined]
    assert store.begin(current or "", os.getpid())
    assert store.complete(current or "", "validated", "", {"verdict": "validated"})
    assert not other.complete(current or "", "failed", "late", {"verdict": "failed"})
    row = store.port("b1", "m")
    assert row is not None and row.status == "validated" and row.result == {"verdict": "validated"}
    assert store.claim("b1", "m") is None  # finished: never claimed again
    other.close()
    store.close()


def test_claim_after_a_dead_driver_resumes_the_same_thread(tmp_path: Path) -> None:
    store = _store_with_port(tmp_path)
    first = store.claim("b1", "m")
    assert first is not None and not first.resumed
    store.begin(first.attempt_id, 1)
    # the driver dies here: the port stays "running" without a result; the next driver claims it again
    again = store.claim("b1", "m")
    assert again is not None and again.resumed and again.thread_id == first.thread_id
    assert not store.complete(first.attempt_id, "validated", "", {})  # the dead attempt cannot write any more
    assert store.complete(again.attempt_id, "failed", "boom", {})
    assert store.requeue_failed("b1") == 1  # --retry-failed: a new thread, not a resume of the failed one
    retry = store.claim("b1", "m")
    assert retry is not None and not retry.resumed and retry.thread_id != first.thread_id
    assert [a["outcome"] for a in store.attempts("b1", "m")] == [None, "failed", None]
    store.close()


def test_without_ray_the_cli_says_how_to_install(tmp_path: Path, npuport_home: Path) -> None:
    manifest = write_zoo(tmp_path)
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['npuport', 'batch', sys.argv[1]]\n"
            "from api.cli import main; main()")
    env = dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200")
    env.pop("RAY_ADDRESS", None)
    r = subprocess.run([sys.executable, "-c", code, str(manifest)], capture_output=True, text=True, env=env,
                       cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install 'npuport[batch]'" in r.stderr and "Traceback" not in r.stderr


def test_invalid_manifest_exits_2(tmp_path: Path, npuport_home: Path) -> None:
    (tmp_path / "b.yaml").write_text("models:\n  - path: nowhere\n")
    env = dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200")
    r = subprocess.run([sys.executable, "-m", "api.cli", "batch", str(tmp_path / "b.yaml")], capture_output=True,
                       text=True, env=env, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 2 and "models[0]" in r.stderr and "does not exist" in r.stderr


def _processes_in(folder: Path) -> list[str]:
    """Live processes (other than zombies) whose working directory lies in ``folder``: sandbox runs
    work in their port's workspace."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cwd = os.readlink(d / "cwd")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and cwd.startswith(str(folder)):
            found.append(f"{d.name} {cmd[:200]}")
    return found


@pytest.mark.slow
def test_local_executor_batch_with_a_hanging_model(tmp_path: Path, npuport_home: Path) -> None:
    """A port that hangs is killed at its timeout (with its sandbox run) and the others still validate."""
    manifest = write_zoo(tmp_path, hang=True)
    out = tmp_path / "out"
    # the plain process sandbox: bwrap's --die-with-parent would end the run with its port by itself
    env = dict(os.environ, NPUPORT_HOME=str(npuport_home), COLUMNS="200", NPUPORT_SANDBOX="process")
    r = subprocess.run([sys.executable, "-m", "api.cli", "batch", str(manifest), "--executor", "local",
                        "--workers", "2", "--out", str(out)], capture_output=True, text=True, env=env,
                       cwd=REPO_ROOT, timeout=400)
    assert r.returncode == 1, r.stdout + r.stderr
    rows = {row["model"]: row for row in json.loads((out / "results.json").read_text())["ports"]}
    assert rows["alpha"]["verdict"] == rows["beta"]["verdict"] == "validated"
    assert rows["gamma"]["verdict"] == "failed" and "timed out after 12 s" in rows["gamma"]["reason"]
    # the killed port's sandbox run did not outlive it
    assert not _processes_in(npuport_home)
    # beta came from an archive and ran shrunk as `npuport port --shrink` does: the request carries shrink,
    # every run derived the small config (sandbox/harness/shrink.py) with the model's npuport.yaml override on top;
    # the user's files are untouched
    report = json.loads((out / "beta" / "report.json").read_text())
    assert report["request"]["shrink"] is True
    runs_shrunk = [r.get("shrunk") for r in report["runs"]]
    assert runs_shrunk and all(s is not None and any(c.startswith("vocab: 32 -> 24") for c in s) for s in runs_shrunk)
    assert json.loads((tmp_path / "src" / "beta" / "config.json").read_text())["vocab"] == 32
    assert "shrink" not in json.loads((out / "alpha" / "report.json").read_text())["request"] or \
        json.loads((out / "alpha" / "report.json").read_text())["request"]["shrink"] is False
    # a rerun of the same manifest says what it skipped (nothing runs again)
    again = subprocess.run([sys.executable, "-m", "api.cli", "batch", str(manifest), "--executor", "local",
                            "--workers", "2", "--out", str(out)], capture_output=True, text=True, env=env,
                           cwd=REPO_ROOT, timeout=200)
    assert "skipped 3 port(s) an earlier run of this batch finished" in again.stdout, again.stdout + again.stderr


def test_knowledge_base_writes_are_serialized_across_processes(npuport_home: Path) -> None:
    from knowledge.locks import home_lock

    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom knowledge.locks import home_lock\n"
         "with home_lock('knowledge-base'):\n    print('held', flush=True)\n    time.sleep(30)"],
        stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT, env=dict(os.environ, NPUPORT_HOME=str(npuport_home)))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(TimeoutError), home_lock("knowledge-base", timeout_s=0.5):
            pass
    finally:
        holder.kill()
        holder.wait()
    with home_lock("knowledge-base", timeout_s=5):  # the kernel dropped the dead holder's lock
        pass


def test_report_says_which_port_learned_and_which_reused(npuport_home: Path, tmp_path: Path) -> None:
    from graph.batch.results import write_results
    from graph.batch.store import BatchRow, PortRow

    recs = [{"id": "memory:old", "signature": "s0", "patch_summary": "p0", "model": "zeta"},
            {"id": "memory:aaa", "signature": "s1", "patch_summary": "p1", "model": "alpha"}]
    (npuport_home / "port_memory.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    batch = BatchRow(id="b", name="b", owner="me", created=0, updated=0, status="done",
                     spec={"memory_before": ["memory:old"]}, out_dir=str(tmp_path), reason="")

    def port(key: str, pos: int, cited: list[str]) -> PortRow:
        res = {"model_path": f"/x/{key}", "memory_cited": cited, "target": "cpu", "sandbox_runs": 2}
        return PortRow(batch_id="b", key=key, pos=pos, spec={}, status="validated", attempt_id="a", attempts=1,
                       thread_id="t", claimed=0, started=0, finished=1, reason="", result=res)

    files = write_results(batch, [port("alpha", 0, []), port("beta", 1, ["memory:aaa", "memory:old"])],
                          npuport_home, tmp_path / "out")
    rows = {r["model"]: r for r in json.loads(files["json"].read_text())["ports"]}
    assert rows["alpha"]["learned"] == ["memory:aaa"] and rows["alpha"]["reused"] == []
    assert rows["beta"]["reused"] == ["memory:aaa (from alpha)", "memory:old (from earlier)"]
    md = files["md"].read_text()
    assert "- alpha learned: memory:aaa" in md and "- beta reused: memory:aaa (from alpha)" in md


def test_live_table_counts_and_eta(tmp_path: Path) -> None:
    from rich.console import Console

    from api.batch_cli import progress_table
    from graph.batch.runner import BatchView
    from graph.batch.store import PortRow

    def row(key: str, status: str, started: float | None, finished: float | None) -> PortRow:
        return PortRow(batch_id="b", key=key, pos=0, spec={}, status=status, attempt_id=None, attempts=1,
                       thread_id=None, claimed=None, started=started, finished=finished, reason="",
                       result={"sandbox_runs": 2} if finished else None)

    view = BatchView("b", [row("a", "validated", 0.0, 10.0), row("b", "failed", 0.0, 20.0),
                           row("c", "running", 1.0, None), row("d", "queued", None, None)], 0.0, 2, "ray")
    assert view.eta_s() == 15.0  # mean 15 s per port, 2 left, 2 at once
    console = Console(record=True, width=160)
    console.print(progress_table(view))
    text = console.export_text()
    assert "1 queued, 1 running, 1 validated, 1 failed" in text and "ETA 15s" in text


def test_archives_unpack_safely(tmp_path: Path) -> None:
    import zipfile

    from graph.batch.sources import stage
    from knowledge.errors import SourceError

    model = write_tiny_model(tmp_path / "m")
    with zipfile.ZipFile(tmp_path / "m.zip", "w") as zf:
        for f in model.iterdir():
            zf.write(f, f"m/{f.name}")
    folder, note = stage(tmp_path / "m.zip", "archive", False, tmp_path / "staging" / "m")
    assert (folder / "npuport.yaml").is_file() and folder.is_relative_to(tmp_path / "staging") and "unpacked" in note
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("../outside.py", "x = 1\n")
    with pytest.raises(SourceError, match="not allowed"):
        stage(tmp_path / "evil.zip", "archive", False, tmp_path / "staging" / "evil")
    assert not (tmp_path / "staging" / "outside.py").exists()
