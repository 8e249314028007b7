"""The environment of the model's era, inferred from what the code uses and what installs here
(agents/environment/era.py, resolve.py, layered.py): sub-configs' saved release when the composite names
none, the oldest line with wheels for this Python, a coupling that caps the era below 4.50, modules a
distribution dropped, host packages reconciled only where the env imports them, and one base env per era
that each model's own layer sits on."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from agents.environment.compat import host_version, load_compat
from agents.environment.era import era_ceiling, era_transformers, imported_by_env, python_floor
from agents.environment.layered import MARKER, ensure_env
from agents.environment.pins import saved_transformers_version
from agents.environment.resolve import resolve
from agents.rules.h18_version_couplings import couplings

HOST_TF = host_version("transformers") or ""
needs_tf5 = pytest.mark.skipif(not HOST_TF.startswith("5."), reason="the host's transformers is not 5.x")

COMPOSITE = textwrap.dedent('''\
    from transformers import PretrainedConfig


    class PartConfig(PretrainedConfig):
        def __init__(self, n_embd=8, **kwargs):
            self.n_embd = n_embd
            super().__init__(**kwargs)


    class PairConfig(PretrainedConfig):
        is_composition = True

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            assert "encoder" in kwargs and "decoder" in kwargs, "needs encoder and decoder"
            self.encoder = PartConfig(**kwargs.pop("encoder"))
            self.decoder = PartConfig(**kwargs.pop("decoder"))
''')


def _model(root: Path, config: dict[str, object], source: str) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config))
    (root / "configuration_pair.py").write_text(source)
    return root


def test_a_composite_config_that_cannot_be_built_bare_caps_the_era() -> None:
    found = couplings(COMPOSITE)
    assert [(c.rule, c.line, c.before) for c in found] == [("composite-config-init", 10, "4.45")]
    assert "catches only ValueError" in found[0].reason and "an assert" in found[0].reason
    # a composite config that raises ValueError is what transformers expects: no coupling
    assert not couplings(COMPOSITE.replace('assert "encoder" in kwargs and "decoder" in kwargs, "needs encoder and '
                                           'decoder"',
                                           'if "encoder" not in kwargs:\n            raise ValueError("x")'))
    # not declared composite: every 4.x release builds it bare in to_diff_dict, nothing newer breaks it
    assert not couplings(COMPOSITE.replace("    is_composition = True\n", ""))


def test_the_saved_release_of_a_composite_is_its_sub_configs_and_lifted_to_what_installs(tmp_path: Path) -> None:
    model = _model(tmp_path / "pair", {"transformers_version": None,
                                       "encoder": {"transformers_version": "4.21.3"},
                                       "decoder": {"transformers_version": "4.20.1"}}, COMPOSITE)
    assert saved_transformers_version(model) == "4.21.3"
    floor = python_floor(load_compat())
    if sys.version_info[:2] == (3, 11):
        assert floor == "4.23"  # tokenizers < 0.13 (transformers <= 4.22) has no CPython 3.11 wheels
    assert era_transformers("4.21.3", "5.25.0", "4.23") == "transformers~=4.23.0"
    assert era_transformers("4.36.2", "5.25.0", "4.23") == "transformers~=4.36.0"
    assert era_ceiling(model) == ("4.45", era_ceiling(model)[1])  # type: ignore[index]
    assert "configuration_pair.py:10" in era_ceiling(model)[1]  # type: ignore[index]


@needs_tf5
def test_resolve_picks_an_era_that_installs_and_that_the_code_runs_with(tmp_path: Path) -> None:
    nested = resolve(_model(tmp_path / "a", {"transformers_version": None,
                                             "encoder": {"transformers_version": "4.21.3"}}, COMPOSITE), "cpu", None)
    floor = python_floor(load_compat())
    if floor:
        assert nested.era == f"transformers~={floor}.0"
        assert any("has no wheels for Python" in n and floor in n for n in nested.notes)
    assert nested.era_last == "transformers<4.45"  # what the era falls back to, never past the coupling
    # no release named anywhere: the newest 4.x below the coupling, not the last 4.x
    bare = resolve(_model(tmp_path / "b", {}, COMPOSITE), "cpu", None)
    assert bare.era == bare.era_last == "transformers<4.45" and bare.install[0] == "transformers<4.45"
    assert any("needs a release older than <4.50" in n and "configuration_pair.py:10" in n for n in bare.notes)


def test_a_module_the_hosts_distribution_dropped_is_installed_from_a_release_that_has_it(tmp_path: Path) -> None:
    if importlib.util.find_spec("pkg_resources") is not None:
        pytest.skip("the host's setuptools still provides pkg_resources")
    model = tmp_path / "m"
    model.mkdir()
    (model / "modeling_m.py").write_text("import pkg_resources\nimport torch\n")
    res = resolve(model, "cpu", None)
    assert "setuptools<82" in res.install and res.pins["setuptools"] == "setuptools<82"
    assert any("no longer provides it" in n and "modeling_m.py:1" in n for n in res.notes)


def test_host_packages_are_reconciled_only_where_the_env_imports_them(tmp_path: Path) -> None:
    site = tmp_path / "env" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "userlib").mkdir(parents=True)
    (site / "userlib" / "hub.py").write_text("def load():\n    from kernels import get_kernel\n    return get_kernel\n")
    (site / "sentence_transformers").mkdir()  # a release the env holds itself: its own files do not count
    (site / "sentence_transformers" / "x.py").write_text("import sentence_transformers.util\n")
    (site / "note.py").write_text('PATH = "kernels"  # a string is no import\nimport yaml\n')
    python = tmp_path / "env" / "bin" / "python"
    assert imported_by_env(python, ["kernels", "sentence-transformers", "pyyaml"]) == {"kernels", "pyyaml"}


# ---------------------------------------------------------------------------------------------
# One base env per era, each model's own layer on it (real pip, offline, hand-made wheels)
# ---------------------------------------------------------------------------------------------


def _wheel(folder: Path, name: str, version: str, module: str, body: str, requires: tuple[str, ...] = ()) -> None:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    needs = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{module}/__init__.py": body,
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{needs}",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: npuport-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(c.encode())}" for p, c in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        for path, content in files.items():
            z.writestr(path, content)


@pytest.mark.slow
def test_models_of_one_era_share_its_base_env_and_layer_only_their_own_pins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, npuport_home: Path
) -> None:
    """The envs live where a user's do, under NPUPORT_HOME, which the confined pip cannot see but for the layers
    bound in: a layer whose package requires the base's must find it there, not install a copy (a torch pair's
    base is 5 GB)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "npuport-era-lib", "1.0", "npuport_era_lib", "RELEASE = 'era'\n")
    _wheel(wheels, "npuport-extra-a", "1.0", "npuport_extra_a", "import npuport_era_lib\nA = 1\n",
           requires=("npuport-era-lib",))
    _wheel(wheels, "npuport-extra-b", "1.0", "npuport_extra_b", "B = 2\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.delenv("NPUPORT_ENV_CACHE", raising=False)  # set, the sandbox would bind the whole cache
    cache = npuport_home / "envs"

    def model(name: str, extras: list[str]) -> object:
        root = tmp_path / name
        root.mkdir()
        (root / "requirements.txt").write_text("".join(f"{e}==1.0\n" for e in extras))
        res = resolve(root, "cpu", None)
        era = "npuport-era-lib==1.0"  # stands in for the era's transformers
        res.era, res.era_last, res.era_installs = era, era, [era]
        res.install = [era, *res.install]
        res.needs_layered_env = True
        return res

    a, b, bare = model("a", ["npuport-extra-a"]), model("b", ["npuport-extra-b"]), model("bare", [])
    py_a, py_b, py_bare = (ensure_env(r, cache_root=cache) for r in (a, b, bare))  # type: ignore[arg-type]
    assert py_a and py_b and py_bare
    base = Path(a.era_base)  # type: ignore[attr-defined]
    assert base == Path(b.era_base) == Path(bare.era_base)  # type: ignore[attr-defined]  # one base for the era
    assert py_bare == base / "bin" / "python"  # a model with nothing of its own runs in the base itself
    assert len([d for d in cache.iterdir() if (d / MARKER).is_file()]) == 3  # base + two layers, no copies
    marker = json.loads((py_a.parent.parent / MARKER).read_text())
    assert marker["install"] == ["npuport-extra-a==1.0"] and marker["layers"] == [str(base.resolve())]
    assert json.loads((base / MARKER).read_text())["install"] == ["npuport-era-lib==1.0"]
    probe = "import npuport_era_lib, npuport_extra_a; print(npuport_era_lib.__file__)"
    out = subprocess.run([str(py_a), "-I", "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out).is_relative_to(base)  # the era's package comes from the shared base
    assert not any((py_a.parent.parent / "lib").rglob("npuport_era_lib"))


def test_a_reconciled_package_that_does_not_import_steps_down_to_a_release_that_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's choice fits the declared requirements, but its code imports a name the env's dependency lacks
    (accelerate 0.32 beside huggingface-hub 0.17): the newest release of each lower line is tried until one
    imports (real venv, real pip, a local index)."""
    from agents.environment.era import _importable_release, own_versions
    from agents.environment.layered import run_pip

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "npuport-hub", "0.17.3", "npuport_hub", "OLD = 1\n")
    for version, body in (("0.32.1", "from npuport_hub import NEW\n"), ("0.31.0", "from npuport_hub import NEW\n"),
                          ("0.30.2", "import npuport_hub\n"), ("0.30.1", "import npuport_hub\n")):
        _wheel(wheels, "npuport-accel", version, "npuport_accel", body)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True)
    python = env / "bin" / "python"
    constraints = env / "npuport-constraints.txt"  # where the env build keeps it: the confined pip reads it
    constraints.write_text("npuport-hub==0.17.3\n")
    assert run_pip(python, ["npuport-hub", "npuport-accel"], constraints, 120).returncode == 0
    assert own_versions(python)["npuport-accel"] == "0.32.1"
    kept, stepped = _importable_release(python, "npuport-accel", "0.32.1", run_pip, constraints, 120)
    assert kept == "0.30.2" and own_versions(python)["npuport-accel"] == "0.30.2"
    assert "0.32.1: ImportError" in stepped and "0.31.0: ImportError" in stepped
