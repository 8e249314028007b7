"""bench/zoo.py ports the fetched releases a manifest lists only when each folder is byte for byte the
manifest's (git blob hashes), and judges per target and per set (held-out releases have their own goal)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _zoo_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zoo_bench", ROOT / "bench" / "zoo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo_bench"] = module  # dataclasses resolve the module of their class
    spec.loader.exec_module(module)
    return module


def _git_blob(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()


def _manifest(tmp: Path, root: Path) -> Path:
    """Two releases written under root, listed with git's own blob ids of their files."""
    models = []
    for name, group in (("alpha", "dev"), ("beta", "heldout")):
        folder = root / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "x"}\n')
        (folder / "modeling_x.py").write_text("import torch\n")
        files = [{"path": p.name, "blob": _git_blob(p), "bytes": p.stat().st_size} for p in sorted(folder.iterdir())]
        models.append({"name": name, "set": group, "files": files})
    path = tmp / "extra.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def test_blob_hash_is_gits(tmp_path: Path) -> None:
    f = tmp_path / "a.py"
    f.write_bytes(b"print('x')\n\x00tail")
    assert _zoo_bench().blob_hash(f.read_bytes()) == _git_blob(f)


def test_a_folder_that_differs_from_the_manifest_is_named_and_not_ported(tmp_path: Path) -> None:
    zoo = _zoo_bench()
    root = tmp_path / "fetched"
    manifest = _manifest(tmp_path, root)
    assert [r.problem for r in zoo.extra_releases(manifest, [root])] == ["", ""]
    (root / "alpha" / "modeling_x.py").write_text("import torch  # edited\n")
    (root / "beta" / "config.json").unlink()
    alpha, beta = zoo.extra_releases(manifest, [tmp_path / "elsewhere", root])  # the first root that has it
    assert alpha.path == root / "alpha" and "modeling_x.py (blob differs)" in alpha.problem
    assert "config.json (absent)" in beta.problem and beta.set == "heldout"
    row = zoo.unported_row(alpha, "ascend-sim")
    assert row["status"] == "failed" and row["class"] == "manifest: folder" and "blob differs" in row["reason"]


def test_a_manifest_name_is_one_path_component(tmp_path: Path) -> None:
    zoo = _zoo_bench()
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"models": [{"name": "../escape", "set": "dev", "files": []}]}))
    try:
        zoo.extra_releases(bad, [tmp_path])
    except SystemExit as exit_:
        assert "../escape" in str(exit_)
    else:
        raise AssertionError("a name with a path separator was accepted")
    root = tmp_path / "r"
    (root / "ok").mkdir(parents=True)
    listed = tmp_path / "listed.yaml"
    listed.write_text(yaml.safe_dump({"models": [{"name": "ok", "set": "dev",
                                                  "files": [{"path": "../../etc/passwd", "blob": "0"}]}]}))
    (release,) = zoo.extra_releases(listed, [root])
    assert "not a plain file name" in release.problem


def test_the_verdict_holds_each_target_and_the_held_out_set_to_their_goals() -> None:
    zoo = _zoo_bench()

    def rows(ok_zoo: int, n_zoo: int, ok_held: int, n_held: int) -> list[dict[str, object]]:
        out = [{"target": "cpu", "set": "zoo", "status": "validated" if i < ok_zoo else "failed"} for i in range(n_zoo)]
        return out + [{"target": "cpu", "set": "heldout", "status": "validated" if i < ok_held else "failed"}
                      for i in range(n_held)]

    line, met = zoo.verdict(rows(40, 40, 10, 10), ["cpu"])
    assert met and line == "zoo: validated 50/50 cpu (zoo 40/40, heldout 10/10; 0 of them partial)"
    assert not zoo.verdict(rows(37, 40, 10, 10), ["cpu"])[1]  # 47/50 = 94 % overall: missed
    assert zoo.verdict(rows(39, 40, 9, 10), ["cpu"])[1]  # 96 % overall, held out 9/10 = 90 %: met
    assert not zoo.verdict(rows(40, 40, 8, 10), ["cpu"])[1]  # held out 80 %: missed, though the whole is 96 %


def test_scan_recall_matches_a_listed_class_or_the_class_split_from_it() -> None:
    spec = importlib.util.spec_from_file_location("scan_recall_bench", ROOT / "bench" / "scan_recall.py")
    assert spec and spec.loader
    recall = importlib.util.module_from_spec(spec)
    sys.modules["scan_recall_bench"] = recall
    spec.loader.exec_module(recall)

    class F:
        def __init__(self, hazard: str, file: str, line: int) -> None:
            self.hazard, self.file, self.line = hazard, file, line

    listed = recall.Hazard("engine.py", 177, "H5", "an FFT on the NPU path")
    assert recall.found(listed, [F("H27", "engine.py", 179)], 3)  # H27 was split out of H5 after the list
    assert not recall.found(listed, [F("H27", "engine.py", 179)], 3, successors=False)
    assert not recall.found(listed, [F("H27", "engine.py", 181)], 3)  # 4 lines away
    assert not recall.found(listed, [F("H5", "model.py", 177)], 3)  # another file
    assert not recall.found(recall.Hazard("a.py", 1, "H27", ""), [F("H5", "a.py", 1)], 3)  # never backwards


def test_a_failure_row_names_the_ports_own_verdict_before_matching_words() -> None:
    zoo = _zoo_bench()
    said = ("the model fails by itself at modeling_x.py:630: NameError: name '_flash_supports_window_size' is not "
            "defined (the original, run as written on the CPU under the device redirect, fails there the same way)")
    assert zoo.failure_class(said) == "model fails by itself: NameError"  # not "rewrite" for the word "flash"
    assert zoo.failure_class("the port's run was stopped at its time limit of 300 s on this host") == "timeout"
