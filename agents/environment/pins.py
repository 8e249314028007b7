"""The model's own pins: requirement files, pip lines in its README, setup.py and pyproject.toml, and the
transformers version its config was saved with (read by agents/environment/resolve.py)."""

from __future__ import annotations

import ast
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

# Where a pin was found, most authoritative first (a lower rank wins a disagreement).
RANK = {"requirements": 0, "pyproject": 1, "setup.py": 1, "readme": 2}


# pip options that take a value (so the value is not a requirement).
_PIP_OPTS_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f",
    "--find-links", "-e", "--editable", "-t", "--target", "--prefix", "--root", "--trusted-host",
    "--platform", "--python-version", "--implementation", "--abi", "--src", "--cache-dir", "--log",
}


_PIP_LINE = re.compile(r"\bpip3?(?:\.\d+)?\s+install\s+(?P<args>.+)")


@dataclass(frozen=True)
class Pin:
    name: str  # canonical name (PEP 503)
    requirement: str  # as written, e.g. "transformers==4.46.3"
    source: str  # "requirements.txt:3", "README.md:12", "setup.py", "pyproject.toml"
    kind: str  # requirements | pyproject | setup.py | readme

    @property
    def specifier(self) -> SpecifierSet:
        return Requirement(self.requirement).specifier


def _parse_requirement(text: str) -> Requirement | None:
    text = text.strip().strip("`'\"")
    if not text or text.startswith(("-", ".", "/", "git+", "http")) or text.endswith((".whl", ".tar.gz", ".zip")):
        return None
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.url or (req.marker is not None and not req.marker.evaluate()):
        return None  # a direct URL is not a pin we can resolve; a false marker does not apply here
    return req


def _requirements_file(path: Path, model_dir: Path, kind: str, seen: set[Path]) -> list[Pin]:
    # `-r` may name any path: only files inside the model folder are read.
    if path in seen or not path.is_file() or not path.resolve().is_relative_to(model_dir.resolve()):
        return []
    seen.add(path)
    pins: list[Pin] = []
    for n, raw in enumerate(path.read_text(errors="replace").splitlines(), 1):
        line = raw.split(" #")[0].strip()
        if line.startswith(("-r ", "--requirement ")):
            pins += _requirements_file(path.parent / line.split(None, 1)[1], model_dir, kind, seen)
            continue
        req = _parse_requirement(line)
        if req is not None:
            rel = path.relative_to(model_dir) if path.is_relative_to(model_dir) else path
            pins.append(Pin(canonicalize_name(req.name), str(req), f"{rel}:{n}", kind))
    return pins


def _readme_pins(path: Path, model_dir: Path, seen: set[Path]) -> list[Pin]:
    pins: list[Pin] = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        match = _PIP_LINE.search(line)
        if not match:
            continue
        args = re.split(r"&&|;|\||#|`\s|\\$", match["args"])[0]
        try:
            tokens = shlex.split(args)
        except ValueError:
            tokens = args.split()
        skip_next = False
        for token in tokens:
            if skip_next:
                skip_next = False
                continue
            if token in ("-r", "--requirement"):
                idx = tokens.index(token)
                if idx + 1 < len(tokens):
                    pins += _requirements_file(model_dir / tokens[idx + 1], model_dir, "requirements", seen)
            if token.split("=")[0] in _PIP_OPTS_WITH_VALUE:
                skip_next = "=" not in token
                continue
            req = _parse_requirement(token)
            if req is not None:
                pins.append(Pin(canonicalize_name(req.name), str(req), f"{path.name}:{n}", "readme"))
    return pins


def _setup_py_pins(path: Path) -> list[Pin]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return []
    lists = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List | ast.Tuple)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    pins: list[Pin] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg != "install_requires":
                continue
            value = lists.get(kw.value.id) if isinstance(kw.value, ast.Name) else kw.value
            for elt in getattr(value, "elts", []):
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    req = _parse_requirement(elt.value)
                    if req is not None:
                        pins.append(Pin(canonicalize_name(req.name), str(req), f"setup.py:{elt.lineno}", "setup.py"))
    return pins


def _pyproject_pins(path: Path) -> list[Pin]:
    try:
        deps = tomllib.loads(path.read_text()).get("project", {}).get("dependencies", [])
    except tomllib.TOMLDecodeError:
        return []
    reqs = [r for r in (_parse_requirement(d) for d in deps if isinstance(d, str)) if r is not None]
    return [Pin(canonicalize_name(r.name), str(r), "pyproject.toml", "pyproject") for r in reqs]


def find_pins(model_dir: Path) -> list[Pin]:
    """Every version pin the model folder states: requirements files, setup.py / pyproject.toml
    dependencies and ``pip install`` lines in its README."""
    seen: set[Path] = set()
    pins: list[Pin] = []
    req_files = sorted(model_dir.glob("requirements*.txt")) + sorted(model_dir.glob("requirements/*.txt"))
    for path in req_files:
        pins += _requirements_file(path, model_dir, "requirements", seen)
    if (model_dir / "pyproject.toml").is_file():
        pins += _pyproject_pins(model_dir / "pyproject.toml")
    if (model_dir / "setup.py").is_file():
        pins += _setup_py_pins(model_dir / "setup.py")
    for readme in sorted(model_dir.glob("README*")):
        if readme.is_file():
            pins += _readme_pins(readme, model_dir, seen)
    return pins


def saved_transformers_version(model_dir: Path) -> str | None:
    """config.json's "transformers_version": the release the checkpoint was saved with (a hint). A
    composite config written by hand names none at its top (``"transformers_version": null``) while its
    sub-configs (encoder, decoder, vision_config ...) were saved by a release: the newest of those."""
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else None
    except json.JSONDecodeError:
        return None
    if not isinstance(config, dict):
        return None
    if config.get("transformers_version"):
        return str(config["transformers_version"])
    nested = [str(v["transformers_version"]) for v in config.values()
              if isinstance(v, dict) and isinstance(v.get("transformers_version"), str)]
    return max(nested, key=_release_key) if nested else None


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


# ---------------------------------------------------------------------------------------------
# What the model's code imports (dependencies no file pins)
# ---------------------------------------------------------------------------------------------

# import name -> distribution name, where they differ
IMPORT_TO_DIST = {"yaml": "pyyaml", "PIL": "pillow", "cv2": "opencv-python", "sklearn": "scikit-learn",
                  "attr": "attrs", "google.protobuf": "protobuf", "skimage": "scikit-image", "bs4": "beautifulsoup4",
                  "fitz": "pymupdf", "docx": "python-docx", "Crypto": "pycryptodome",
                  "fla": "flash-linear-attention", "transformer_engine": "transformer-engine",
                  "rotary_emb": "rotary-emb", "cpm_kernels": "cpm-kernels", "flash_rwkv": "flash-rwkv",
                  "pkg_resources": "setuptools", "triton_pre_mlir": "triton-pre-mlir"}


def model_py_files(model_dir: Path) -> list[Path]:
    return [p for p in sorted(model_dir.rglob("*.py"))
            if not any(part.startswith(".") or part in ("__pycache__", "tests", "test") for part in
                       p.relative_to(model_dir).parts[:-1])]


def unconditional_imports(model_dir: Path) -> dict[str, str]:
    """Top-level third-party modules the model's files import at module level, outside any try/if
    (an import a guard protects is optional): {module: "file:line"} of the first such import."""
    import sys

    from agents.environment.imports import own_package_names, parsed_files

    files = model_py_files(model_dir)
    local = own_package_names(model_dir, files)
    found: dict[str, str] = {}
    for path, tree in parsed_files(files):
        for node in tree.body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module.split(".")[0]]
            for n in names:
                if n not in sys.stdlib_module_names and n not in local and n not in found:
                    found[n] = f"{path.relative_to(model_dir).as_posix()}:{node.lineno}"
    return found


def transformers_names(model_dir: Path) -> list[tuple[str, str, str]]:
    """(module, name, "file:line") for every ``from transformers[.x] import name`` in the model's files:
    the API surface that couples the model to a transformers release."""
    out: list[tuple[str, str, str]] = []
    for path in model_py_files(model_dir):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".")[0] == "transformers":
                where = f"{path.relative_to(model_dir).as_posix()}:{node.lineno}"
                out += [(node.module, a.name, where) for a in node.names if a.name != "*"]
    return out
