"""Every file:line a port prints points into the user's files: a line of the patched tree (profiler
stacks, tracebacks) is mapped through the diff to the user's original line, or labelled "(in patched/)"
when the port wrote that line; the CLI summary, the reporter's reason, report.md and chat agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.nodes.validator import validator_node
from agents.report.bundle import final_status, write_bundle
from agents.sites import PATCHED_TAG, original_line, port_site
from agents.workspace import Workspace

USER_LINES = 486
ADDED = 420  # lines the port inserts near the top (a long helper), so the patched file has ~906 lines


def _workspace(tmp_path: Path) -> tuple[Path, Workspace]:
    user = tmp_path / "user_model"
    user.mkdir()
    (user / "modeling_m.py").write_text("".join(f"line_{i} = {i}\n" for i in range(1, USER_LINES + 1)))
    ws = Workspace.create(user, tmp_path / "work")
    text = (ws.model_dir / "modeling_m.py").read_text().splitlines(keepends=True)
    helper = [f"_npuport_helper_{i} = {i}\n" for i in range(ADDED)]
    (ws.model_dir / "modeling_m.py").write_text("".join(text[:3] + helper + text[3:]))
    ws.commit("port: add a helper")
    return user, ws


def test_original_line_follows_the_diff() -> None:
    orig = "a\nb\nc\nd\n"
    patched = "a\nNEW\nb\nc2\nd\n"
    assert original_line(orig, patched, 1) == 1
    assert original_line(orig, patched, 3) == 2  # b moved down by the insert
    assert original_line(orig, patched, 5) == 4
    assert original_line(orig, patched, 2) is None  # inserted by the port
    assert original_line(orig, patched, 4) is None  # rewritten by the port


def test_port_site_maps_to_the_user_s_line_or_labels_the_patched_one(tmp_path: Path) -> None:
    user, ws = _workspace(tmp_path)
    patched_line = ADDED + 480  # line 480 of the user's file, moved down by the helper
    assert port_site(f"modeling_m.py:{patched_line}", ws.root, user) == "modeling_m.py:480"
    assert port_site("modeling_m.py:10", ws.root, user) == f"modeling_m.py:10{PATCHED_TAG}"  # the port's helper
    assert port_site("modeling_m.py:2", ws.root, user) == "modeling_m.py:2"
    assert port_site("/usr/lib/python3/transformers/x.py:7", ws.root, user).endswith("(outside the model's files)")
    # the user editing their folder afterwards does not move the mapping: the original commit is the truth
    (user / "modeling_m.py").write_text("changed\n")
    assert port_site(f"modeling_m.py:{patched_line}", ws.root, user) == "modeling_m.py:480"


def _run(ws: Workspace, run_id: str, purpose: str, site: str) -> dict[str, Any]:
    steps = [{"input_len": 5 + i, "ms": 1.0 + i} for i in range(8)]  # the whole sequence every step: no KV cache
    result = ws.runs_dir / run_id / "result.json"
    result.parent.mkdir(parents=True)
    result.write_text(json.dumps({"profile": {"steps": steps, "step_site": site, "step": "forward"}}))
    return {"id": run_id, "purpose": purpose, "target": "cpu", "ok": True, "status": "ok", "wall_s": 1.0,
            "result_path": str(result), "tokens": [[1, 2, 3]]}


def test_cli_reporter_report_and_chat_name_the_user_s_line(tmp_path: Path) -> None:
    user, ws = _workspace(tmp_path)
    site = f"modeling_m.py:{ADDED + 480}"  # 900: past the end of the user's 486-line file
    state: dict[str, Any] = {"request": {"model_path": str(user)}, "workdir": str(ws.root), "findings": [],
                             "runs": [_run(ws, "ref", "reference", site), _run(ws, "run-1", "port", site)]}
    update = validator_node(state)
    found = update["perf"]["pathologies"]
    assert found and found[0]["where"] == site and found[0]["user_where"] == "modeling_m.py:480"
    state.update(update)

    status, reason = final_status(state)  # the reporter's step line and the job's reason
    assert status == "validated" and "at modeling_m.py:480" in reason and site not in reason

    out = tmp_path / "bundle"
    state.update({"status": status, "reason": reason, "patches": [], "counters": {}, "trace": [], "diagnoses": []})
    write_bundle(state, out, status, reason)
    md = (out / "report.md").read_text()
    assert "modeling_m.py:480" in md and site not in md, md[:3000]

    from api import cli_port

    with cli_port.console.capture() as captured:  # the CLI's summary table, as it would be printed
        cli_port.print_summary({**state, "bundle": {"dir": str(out)}})
    printed = captured.get()
    assert "modeling_m.py:480" in printed and site not in printed, printed


def test_the_executor_step_line_names_the_user_s_line_of_a_failure(tmp_path: Path) -> None:
    """A real sandbox run of a patched tree that fails: the executor's step line (what the CLI and the page
    show) gives the failing line as it is in the user's file, not its number in the patched file."""
    import yaml

    from agents.nodes.executor import executor_node
    from agents.state import target_dict
    from sandbox.targets import resolve_target
    from tests.tiny_models import MANIFEST, write_tiny_model

    user = write_tiny_model(tmp_path / "user_model", twist="scale = 1 / 0")
    failing = next(i for i, text in enumerate((user / "modeling_tiny.py").read_text().splitlines(), 1)
                   if "1 / 0" in text)
    ws = Workspace.create(user, tmp_path / "work")
    source = (ws.model_dir / "modeling_tiny.py").read_text()
    helper = "".join(f"_npuport_helper_{i} = {i}\n" for i in range(40))
    (ws.model_dir / "modeling_tiny.py").write_text(source.replace("import torch\n", "import torch\n" + helper, 1)
                                                   .replace("input_ids.cuda()", "input_ids"))
    ws.commit("port: a helper and the device fix")
    state = {"workdir": str(ws.root), "request": {"model_path": str(user), "target": "cpu"},
             "entry": yaml.safe_load(MANIFEST), "target": target_dict(resolve_target("cpu")), "counters": {}}
    update = executor_node(state)
    summary = update["trace"][0]["summary"]
    assert "ZeroDivisionError" in summary, summary
    assert summary.endswith(f"at modeling_tiny.py:{failing}"), summary  # the user's line, not failing + 40


def test_the_validator_line_shortens_a_long_token_row_as_the_executor_line_does(tmp_path: Path) -> None:
    """A VLM's greedy row holds its prompt's image tokens (DeepSeek-OCR-2: 294 ids): the validator's step line
    printed both rows whole, ~3,000 characters on one line; it keeps their ends now (report.json keeps all)."""
    user, ws = _workspace(tmp_path)
    row = [0] + [128815] * 280 + [13, 85, 104, 7, 7, 7]
    runs = [_run(ws, "ref", "reference", "modeling_m.py:9"), _run(ws, "run-1", "port", "modeling_m.py:9")]
    for r in runs:
        r["tokens"] = [row]
    update = validator_node({"request": {"model_path": str(user)}, "workdir": str(ws.root), "findings": [],
                             "runs": runs})
    line = update["trace"][0]["summary"]
    assert update["numerics"]["verdict"] == "match" and update["numerics"]["port_tokens"] == [row]
    assert line.count("... 275 more ...") == 2 and "(287 ids)" in line and len(line) < 600, line
