"""One request schema for every door: the CLI's options, the API body, Studio's form and the batch manifest
derive their fields from agents/request.py's PortRequest, so a new request field is one line there."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from agents.request import PortRequest

ROOT = Path(__file__).resolve().parents[1]

# Adds one field to PortRequest before any door is imported, then asks each door for it.
PROBE = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from pydantic import Field, create_model
    import agents.request as request

    request.PortRequest = create_model(
        "PortRequest", __base__=request.PortRequest,
        probe_knob=(int, Field(7, ge=0, le=99, description="a field added by the test")))
    found = {}

    # the CLI: `npuport port --probe-knob N` reaches the request the port runs
    from typer.testing import CliRunner
    import api.cli as cli
    sent = {}
    cli.run_port_cli = lambda req, goal="": sent.update(req) or 0
    model = Path(sys.argv[1])
    runner = CliRunner()
    found["cli_help"] = "--probe-knob" in runner.invoke(cli.app, ["port", "--help"], env={"COLUMNS": "200"}).output
    run = runner.invoke(cli.app, ["port", str(model), "--target", "cpu", "--probe-knob", "5",
                                  "--out", sys.argv[2]])
    found["cli_request"] = sent.get("probe_knob")
    found["cli_exit"] = [run.exit_code, run.output[-500:]]

    # the API body: its JSON schema names the field and validates it with its bounds
    from api.routers.ports import PortCreate
    schema = PortCreate.model_json_schema()
    body = schema["$defs"][schema["properties"]["request"]["$ref"].split("/")[-1]]
    found["api_schema"] = body["properties"]["probe_knob"]
    found["api_value"] = PortCreate.model_validate({"request": {"probe_knob": 3}}).request_values()
    try:
        PortCreate.model_validate({"request": {"probe_knob": 100}})
        found["api_bounds"] = False
    except ValueError:
        found["api_bounds"] = True

    # Studio's form (the graph's input schema) and the planner's reading of it
    from graph.builder import build_graph
    from graph.conversation import normalise_input
    found["studio_schema"] = "probe_knob" in build_graph().compile().get_input_jsonschema()["properties"]
    found["studio_request"] = normalise_input({"model_path": "m", "probe_knob": 4})["request"].get("probe_knob")

    # the batch manifest: a default, a model's own value, and the request the batch's port runs
    from graph.batch.manifest import BatchManifest, _merge
    manifest = BatchManifest.model_validate({"defaults": {"probe_knob": 2},
                                             "models": [{"path": "a"}, {"path": "b", "probe_knob": 6}]})
    values = [_merge(manifest.defaults, m).request_values() for m in manifest.models]
    found["batch"] = [request.PortRequest(model_path="m", **v).probe_knob for v in values]
    print(json.dumps(found))
''')


def test_a_field_added_to_port_request_reaches_every_door(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text("import torch\n")
    proc = subprocess.run([sys.executable, "-c", PROBE, str(model), str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT),
                               "NPUPORT_HOME": str(tmp_path / "h")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["cli_help"] is True
    assert found["cli_request"] == 5, found["cli_exit"]
    assert found["api_schema"]["description"] == "a field added by the test"
    assert found["api_value"] == {"probe_knob": 3} and found["api_bounds"] is True
    assert found["studio_schema"] is True and found["studio_request"] == 4
    assert found["batch"] == [2, 6]


def test_each_door_takes_every_request_field() -> None:
    """Today's fields, door by door (less what a door sets itself): nothing restated, nothing missing."""
    from api.cli import app
    from api.cli_options import COMMAND_OWN, request_parameters
    from api.routers.ports import RequestFields
    from graph.batch.manifest import BATCH_SETS, BUDGET_FIELDS, Budget, ModelEntry, PortSettings
    from graph.state import PortInput

    fields = set(PortRequest.model_fields)
    assert {p.name for p in request_parameters()} == fields - set(COMMAND_OWN)
    assert app.registered_commands  # the port command is built with them (test above: its help lists one)
    assert set(RequestFields.model_fields) == fields - {"out_dir"}
    assert fields <= set(PortInput.__annotations__)
    batch_only = {"budget", "timeout_s", "num_cpus", "memory_mb", "threads"}
    assert set(PortSettings.model_fields) - batch_only == fields - set(BATCH_SETS) - set(BUDGET_FIELDS)
    assert set(Budget.model_fields) == set(BUDGET_FIELDS)
    assert set(ModelEntry.model_fields) - {"path", "name"} == set(PortSettings.model_fields)
    # the bounds come along: a manifest's budget is checked as the request's is
    defaults = PortSettings.model_validate({"budget": {"max_runs": 3}, "bench": True, "serve": False})
    assert defaults.request_values()["max_runs"] == 3 and defaults.request_values()["bench"] is True
    assert PortRequest(model_path="m", **defaults.request_values()).serve is False
