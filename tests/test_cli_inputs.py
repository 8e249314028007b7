"""Every bad input to the CLI is refused before the graph starts: exit code 2, one line on stderr, and
no bundle written. In process (typer's CliRunner), so these are quick; the live display and --force
are checked on a real (tiny) port, marked slow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import LiveStatus, app, fmt_params
from tests.tiny_models import write_tiny_model

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.output


def assert_refused(args: list[str], out: Path, needle: str) -> None:
    code, output = run(*args, "--out", str(out))
    assert code == 2, output
    assert needle in output, output
    assert "Traceback" not in output
    assert not out.exists(), "a refused input must not write a bundle"


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "m")


def test_missing_path(tmp_path: Path, npuport_home: Path) -> None:
    assert_refused(["port", str(tmp_path / "nope")], tmp_path / "out", "does not exist")


def test_a_file_is_not_a_model_folder(tmp_path: Path, npuport_home: Path) -> None:
    f = tmp_path / "model.py"
    f.write_text("import torch\n")
    assert_refused(["port", str(f)], tmp_path / "out", "is not a folder")


def test_empty_folder(tmp_path: Path, npuport_home: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert_refused(["port", str(tmp_path / "empty")], tmp_path / "out", "is empty")


def test_folder_without_python(tmp_path: Path, npuport_home: Path) -> None:
    m = tmp_path / "docs_only"
    (m / ".venv").mkdir(parents=True)
    (m / ".venv" / "site.py").write_text("x = 1\n")  # hidden folders do not count as the model's code
    (m / "README.md").write_text("no code\n")
    assert_refused(["port", str(m)], tmp_path / "out", "no Python files")


@pytest.mark.parametrize(("flags", "needle"), [
    (["--chip", "999x"], "unknown chip"),
    (["--target", "gpu"], "unknown target"),
    (["--policy", "magic"], "unknown policy"),
    (["--goal", "port it to Ascend 999X and maximise throughput"], "unknown chip 'Ascend 999X'"),
    (["--goal", "port it --target tpu"], "unknown target 'tpu'"),
])
def test_unknown_chip_target_or_policy(model: Path, tmp_path: Path, npuport_home: Path, flags: list[str],
                                       needle: str) -> None:
    assert_refused(["port", str(model), *flags], tmp_path / "out", needle)


def test_known_chips_in_goal_text_pass_the_check() -> None:
    from agents.request import goal_words_problem, parse_goal

    for goal in ("port ./m to Ascend 910B", "port ./m to Ascend 910B2 NPUs", "to ascend a3", "to Ascend 310P",
                 "port ./m to Ascend NPUs", "port ./m --target ascend-sim"):
        assert goal_words_problem(goal) is None, goal
    assert parse_goal("port the model in ./m to Ascend 310P").chip == "310p"
    with pytest.raises(ValueError, match="999X"):
        parse_goal("port the model in ./m to Ascend 999X")  # never silently 910b


def test_existing_out_dir_is_refused_without_force(model: Path, tmp_path: Path, npuport_home: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.png").write_bytes(b"stale")
    code, output = run("port", str(model), "--out", str(out))
    assert code == 2 and "--force" in output
    assert [p.name for p in out.iterdir()] == ["old.png"], "a refused run must not touch the folder"


def test_out_dir_inside_the_model_is_refused_even_with_force(model: Path, npuport_home: Path) -> None:
    before = sorted(p.name for p in model.iterdir())
    code, output = run("port", str(model), "--out", str(model), "--force")
    assert code == 2 and "overlaps the model folder" in output
    assert sorted(p.name for p in model.iterdir()) == before


def test_scan_exits_2_on_empty_folder_and_syntax_error(model: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert run("scan", str(tmp_path / "empty"))[0] == 2
    (model / "broken.py").write_text("def f(:\n    pass\n")
    code, output = run("scan", str(model))
    assert code == 2 and "broken.py" in output


def test_scan_keeps_file_line_whole_at_80_columns(model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from api import cli

    monkeypatch.setattr(cli.console, "_width", 80)  # a terminal of 80 columns
    monkeypatch.setattr(cli.console, "soft_wrap", False)
    code, output = run("scan", str(model))
    assert code == 0, output
    assert "modeling_tiny.py:" in output  # file:line printed whole
    assert max(len(line) for line in output.splitlines()) <= 80, output
    assert "{'" not in output, "entry printed as a raw dict"
    assert "class   modeling_tiny:TinyLM" in output


def _exit_table(doc: Path, header: str) -> list[tuple[int, str]]:
    """The rows (code, meaning) of the exit-code table that ``header`` opens in ``doc``."""
    lines = doc.read_text().splitlines()
    start = lines.index(header) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        code, meaning = (c.strip() for c in line.strip("|").split("|", 1))
        rows.append((int(code), meaning))
    return rows


def test_help_readme_and_docs_list_the_exit_codes_of_the_code() -> None:
    from api.cli_port import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_MEANINGS, EXIT_NOT_VERIFIED
    from knowledge.errors import EXIT_CODES

    # every code the CLI returns has a meaning: the error kinds' codes, 0 / 130 of the port's path, verify's 4
    assert set(EXIT_CODES.values()) | {0, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NOT_VERIFIED} == set(EXIT_MEANINGS)
    code, output = run("--help")
    assert code == 0
    flat = " ".join(output.split())
    for n, text in EXIT_MEANINGS.items():
        assert f"{n} {text}" in flat, output
    code, output = run("port", "--help")
    assert code == 0 and "130 interrupted" in " ".join(output.split()), output
    root = Path(__file__).resolve().parents[1]
    for doc, header in ((root / "README.md", "| exit code | meaning |"),
                        (root / "docs" / "cli.md", "| code | meaning |")):
        rows = _exit_table(doc, header)
        assert [n for n, _ in rows] == list(EXIT_MEANINGS), (doc, rows)
        for n, meaning in rows:
            assert meaning.startswith(EXIT_MEANINGS[n]), (doc, n, meaning)


def test_live_status_line_counts_runs_and_trials() -> None:
    s = LiveStatus(max_runs=8, tune_trials=4)
    s.on_event("task", {"node": "executor"})
    assert "executor" in s.line().plain and "sandbox run 1/8" in s.line().plain
    s.on_event("counters", {"port_runs": 1, "reference_runs": 1})
    assert "sandbox run 1/8" in s.line().plain  # the finished run is not counted twice
    s.on_event("task", {"node": "tuner"})
    s.on_event("trial_start", {"k": 2, "n": 4})
    s.on_event("trial_done", {"k": 2, "n": 4, "value": 31.5, "params": {"batch": 4}})
    s.on_event("trial_done", {"k": 3, "n": 4, "value": None, "params": {"batch": 8}})
    line = s.line().plain
    assert "trial 2/4" in line and "best 31.5 tok/s (batch=4)" in line and "sandbox run 1/8" in line
    assert fmt_params({"batch": 4, "dtype": "bf16"}) == "batch=4 dtype=bf16"


@pytest.mark.slow
def test_force_replaces_a_stale_bundle_and_shrink_reaches_the_harness(model: Path, tmp_path: Path,
                                                                      npuport_home: Path) -> None:
    from knowledge.bundles import mark_bundle

    out = tmp_path / "out"
    mark_bundle(out, "an earlier port")  # an earlier bundle: --force may replace it
    (out / "plots").mkdir(parents=True)
    (out / "plots" / "stale.png").write_bytes(b"old plot")
    code, output = run("port", str(model), "--target", "cpu", "--out", str(out), "--force", "--policy", "rule",
                       "--shrink")
    assert code == 0, output
    # --shrink reaches the harness spec of the port run and of the reference alike
    for name in ("run-1", "reference"):
        (spec,) = npuport_home.glob(f"workspaces/*/runs/{name}/spec.json")
        assert json.loads(spec.read_text())["shrink"] is True, name
    assert not (out / "plots" / "stale.png").exists()
    assert json.loads((out / "report.json").read_text())["status"] == "validated"
    for agent in ("planner", "code_reader", "executor", "validator", "reporter"):
        assert agent in output


def test_demo_ends_with_the_next_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the demo's closing lines: the port itself is replaced by a validated result here (the
    whole demo is covered by .ci/run and the slow CLI tests)."""
    from agents import deploy
    from agents.deploy.verify import Claim, VerifyResult
    from api import cli

    seen: dict[str, object] = {}
    monkeypatch.setattr(cli, "run_port_cli", lambda request, goal="": seen.update(request) or cli.EXIT_OK)
    verdicts = {"throughput": "agree"}
    monkeypatch.setattr(deploy, "verify_bundle", lambda bundle, original: VerifyResult(bundle=str(bundle), claims=[
        Claim(name="throughput", verdict=verdicts["throughput"], detail="28.1 tokens/s now vs 27.0 reported")]))
    out = tmp_path / "demo-out"
    code, output = run("demo", "--out", str(out))
    assert code == 0, output
    assert seen["tune"] is True and seen["out_dir"] == str(out)
    assert "AGREE     throughput: 28.1 tokens/s now" in output  # the demo ends with its own check
    assert f"npuport verify {out}" in output and "npuport serve" in output and "report.md" in output
    verdicts["throughput"] = "disagree"  # the demo's numbers must survive that check, or it fails
    code, output = run("demo", "--out", str(tmp_path / "demo-2"))
    assert code == 1 and "verify: disagree" in output and "next:" not in output
    out.mkdir()
    (out / "report.md").write_text("old")
    assert run("demo", "--out", str(out))[0] == 2  # an earlier demo's bundle is not overwritten silently


# -- issue 27: --force removes only npuport's own bundle; sources are checked before anything runs ----------


def test_force_never_empties_a_folder_npuport_did_not_write(model: Path, tmp_path: Path, npuport_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from api import cli

    monkeypatch.setattr(cli, "run_port_cli", lambda request, goal="": pytest.fail("the port must not start"))
    out = tmp_path / "my-notes"
    (out / "drafts").mkdir(parents=True)
    (out / "notes.md").write_text("mine\n")
    (out / "drafts" / "a.txt").write_text("also mine\n")
    code, output = run("port", str(model), "--out", str(out), "--force")
    assert code == 2, output
    assert "did not write" in output and "never emptied" in " ".join(output.split())
    assert (out / "notes.md").read_text() == "mine\n" and (out / "drafts" / "a.txt").is_file()


def test_force_replaces_npuport_s_own_bundle(model: Path, tmp_path: Path, npuport_home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from api import cli
    from knowledge.bundles import MARKER, mark_bundle

    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "run_port_cli", lambda request, goal="": seen.append(
        sorted(p.name for p in Path(request["out_dir"]).glob("*"))) or cli.EXIT_OK)
    out = tmp_path / "bundle"
    mark_bundle(out, "t-1")
    (out / "plots").mkdir()
    (out / "plots" / "stale.png").write_bytes(b"old")
    assert run("port", str(model), "--out", str(out))[0] == 2  # without --force: refused, kept
    assert (out / MARKER).is_file() and (out / "plots" / "stale.png").is_file()
    code, output = run("port", str(model), "--out", str(out), "--force")
    assert code == 0, output
    assert seen == [[]], "the old bundle is removed before the port starts"


def test_a_bundle_carries_the_marker(tmp_path: Path) -> None:
    from agents.report.bundle import write_bundle
    from knowledge.bundles import bundle_dir_problem, is_npuport_bundle

    out = tmp_path / "b"
    write_bundle({"request": {"model_path": "m"}, "trace": []}, out, "failed", "test")
    assert is_npuport_bundle(out) and bundle_dir_problem(out) is None
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "report.json").write_text('{"mine": 1}')  # a user's report.json is no marker
    assert not is_npuport_bundle(tmp_path / "user") and bundle_dir_problem(tmp_path / "user")


def test_a_syntax_error_is_refused_before_anything_runs(model: Path, tmp_path: Path, npuport_home: Path) -> None:
    (model / "pkg").mkdir()
    (model / "pkg" / "broken.py").write_text("import torch\n\ndef f(:\n    pass\n")
    assert_refused(["port", str(model)], tmp_path / "out", "pkg/broken.py:3: SyntaxError")
    assert not list(npuport_home.glob("workspaces/*")), "no workspace: nothing ran"


def test_non_utf8_source_is_named_and_refused(model: Path, tmp_path: Path, npuport_home: Path) -> None:
    (model / "legacy.py").write_bytes(b"# comment\nNAME = '\xe9t\xe9'\n")
    assert_refused(["port", str(model)], tmp_path / "out", "legacy.py:2: not valid utf-8")
    code, output = run("scan", str(model), "--json")
    assert code == 2
    assert any("legacy.py" in p for p in json.loads(output)["source_problems"]), output


def test_a_declared_encoding_is_decoded_per_pep_263(model: Path, tmp_path: Path) -> None:
    from agents.reading.scanner import scan_tree
    from sandbox.isolation.source_check import check_sources

    (model / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nimport torch\nx = torch.zeros(1).cuda()  # \xe9\n")
    assert check_sources(model) == []
    result = scan_tree(model)
    assert "latin.py" in result.files and any(f.file == "latin.py" for f in result.findings)
    (model / "bad.py").write_bytes(b"# -*- coding: klingon -*-\nx = 1\n")
    (problem,) = check_sources(model)
    assert problem.file == "bad.py" and problem.kind == "encoding"


def test_target_npu_without_torch_npu_is_refused(model: Path, tmp_path: Path, npuport_home: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        pytest.skip("torch_npu is installed here")
    assert_refused(["port", str(model), "--target", "npu"], tmp_path / "out", "torch_npu cannot be imported")
    assert_refused(["port", str(model), "--target", "npu", "--goal", "maximise throughput"], tmp_path / "o2",
                   "--target npu needs")


def test_the_reporter_never_overwrites_another_bundle_or_a_user_folder(tmp_path: Path, npuport_home: Path) -> None:
    """A run that names an out_dir holding another port's bundle (a CLI bundle, when Studio ports the same
    model) writes its own bundle under the home and says where; the other bundle is untouched."""
    from agents.nodes.reporter import reporter_node
    from knowledge.bundles import mark_bundle

    other = tmp_path / "cli-bundle"
    mark_bundle(other, owner="/somewhere/else/workspace")
    (other / "report.md").write_text("the CLI's report\n")
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.md").write_text("mine\n")
    for taken in (other, user):
        state = {"request": {"model_path": "m", "out_dir": str(taken)}, "workdir": str(tmp_path / "ws-1"),
                 "trace": [], "status": "failed", "reason": "test"}
        out = reporter_node(state)
        written = Path(out["bundle"]["dir"])
        assert written == npuport_home / "jobs" / "ws-1" / "bundle" and (written / "report.json").is_file()
        assert "not overwritten" in out["bundle"]["note"] or "never emptied" in out["bundle"]["note"]
        assert str(written) in out["trace"][0]["summary"]
    assert (other / "report.md").read_text() == "the CLI's report\n" and not (other / "report.json").exists()
    assert sorted(p.name for p in user.iterdir()) == ["notes.md"]
    # the same port (a resume) rewrites its own bundle
    mine = tmp_path / "mine"
    state = {"request": {"model_path": "m", "out_dir": str(mine)}, "workdir": str(tmp_path / "ws-2"), "trace": []}
    assert reporter_node(state)["bundle"]["dir"] == str(mine)
    assert reporter_node(state)["bundle"]["dir"] == str(mine)


def test_without_out_dir_the_bundle_goes_under_the_home(tmp_path: Path, npuport_home: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.report.bundle import default_out_dir

    monkeypatch.chdir(tmp_path)  # never the working directory (a LangGraph server's watched project)
    state = {"request": {"model_path": "m"}, "workdir": str(npuport_home / "workspaces" / "m-abc")}
    assert default_out_dir(state) == npuport_home / "jobs" / "m-abc" / "bundle"


def test_cli_conventions_version_short_help_choices_and_scan_summary(model: Path) -> None:
    code, output = run("--version")
    assert code == 0 and output.startswith("npuport ")
    from sandbox.targets import chip_names, target_names

    TARGETS, CHIPS = target_names(), chip_names()

    output = runner.invoke(app, ["port", "--help"], env={"COLUMNS": "300"}).output
    flat = "".join(output.split())
    assert f"[{'|'.join(TARGETS)}]" in flat and f"[{'|'.join(CHIPS)}]" in flat and "[rule|llm|hybrid]" in flat
    assert "[auto|bwrap|process]" in flat
    code, output = run("settings")
    assert code == 0 and "NPUPORT_HOME" in output
    (model / "extra.py").write_text("import torch\nx = torch.zeros(1).cuda()\nprint(x.item())\n")
    code, output = run("scan", str(model))
    assert code == 0, output
    first = output.splitlines()[0]
    assert "hazards in" in first and "block running" in first and "slow it down" in first


def test_piped_output_is_not_wrapped_at_80_columns(model: Path, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    r = subprocess.run([sys.executable, "-m", "api.cli", "scan", str(model)], capture_output=True, text=True,
                       env=env, cwd=REPO_ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert any(len(line) > 80 for line in r.stdout.splitlines()), r.stdout  # whole lines in a pipe
