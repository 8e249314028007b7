"""The workspace: a git repository holding a copy of the user's model. Every patch is a commit, so
``git diff <original>`` is the port. The user's original tree is only ever read."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from knowledge.errors import WorkspaceError  # noqa: F401  (re-exported)

# Copied trees skip what is not source and would bloat the workspace.
_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache", ".pytest_cache",
                                 "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.onnx", "*.gguf")
_GIT_ID = ["-c", "user.name=npuport", "-c", "user.email=npuport@localhost", "-c", "commit.gpgsign=false"]
MAX_COPY_BYTES = 200 * 1024 * 1024


def tree_digest(root: Path) -> str:
    """sha256 over every file's relative path and bytes (used to prove the original is untouched)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and ".git" not in p.relative_to(root).parts:
            h.update(p.relative_to(root).as_posix().encode())
            with p.open("rb") as fh:  # streamed: weights can be gigabytes
                h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def _git(cwd: Path, *args: str) -> str:
    r = subprocess.run(["git", *_GIT_ID, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


@dataclass(frozen=True)
class Workspace:
    root: Path  # the workdir: model/ (git) + runs/

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @classmethod
    def create(cls, original: Path, root: Path) -> Workspace:
        original = original.resolve()
        ws = cls(root.resolve())
        if ws.model_dir.exists() and (ws.model_dir / ".git").exists():
            return ws  # resuming: the workspace already holds the original commit and the patches
        size = sum(p.stat().st_size for p in original.rglob("*")
                   if p.is_file() and ".git" not in p.parts and not _IGNORE(str(p.parent), [p.name]))
        if size > MAX_COPY_BYTES:
            raise WorkspaceError(f"{original} holds {size // 2**20} MiB of files; npuport copies source trees up to "
                                 f"{MAX_COPY_BYTES // 2**20} MiB (weights are not needed)")
        ws.root.mkdir(parents=True, exist_ok=True)
        ws.runs_dir.mkdir(exist_ok=True)
        shutil.copytree(original, ws.model_dir, ignore=_IGNORE, symlinks=False, ignore_dangling_symlinks=True)
        _git(ws.model_dir, "init", "-q", "-b", "npuport")
        _git(ws.model_dir, "add", "-A")
        _git(ws.model_dir, "commit", "-q", "--allow-empty", "-m", "original model as given")
        _git(ws.model_dir, "tag", "original")
        return ws

    def commit(self, message: str) -> str | None:
        """Commit every change; None when nothing changed."""
        _git(self.model_dir, "add", "-A")
        if not _git(self.model_dir, "status", "--porcelain").strip():
            return None
        _git(self.model_dir, "commit", "-q", "-m", message)
        return self.head()

    def head(self) -> str:
        return _git(self.model_dir, "rev-parse", "HEAD").strip()

    def diff_from_original(self) -> str:
        return _git(self.model_dir, "diff", "original", "HEAD")

    def changed_files(self, commit: str) -> list[str]:
        out = _git(self.model_dir, "show", "--name-only", "--pretty=format:", commit)
        return [line for line in out.splitlines() if line.strip()]

    def export_tree(self, dest: Path) -> None:
        """The patched tree, without git metadata."""
        shutil.copytree(self.model_dir, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"), dirs_exist_ok=True)

    def original_tree(self, dest: Path) -> None:
        """The original as committed (for the reference run)."""
        if dest.exists():
            return
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "original"], cwd=self.model_dir, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
