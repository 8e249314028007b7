"""The workspace: a git repository holding a copy of the user's model. Every patch is a commit, so
``git diff <original>`` is the port. The user's original tree is only ever read.

The model's code is hostile until proven otherwise, so npuport's own git is kept out of its reach:
the repository lives in ``<root>/.npuport-git`` (never inside the tree the model runs from, and hidden
from sandboxed runs), every git call gets a fixed environment with no system or global config, and
its config, hooks and attributes are npuport's own, rewritten before each call. So nothing the model
writes (a hook, core.fsmonitor, diff.external, a pager, a .gitattributes filter) is ever executed."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from knowledge.errors import WorkspaceError

# Copied trees skip what is not source and would bloat the workspace.
_IGNORE = shutil.ignore_patterns(".git", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache", ".pytest_cache",
                                 "*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.onnx", "*.gguf")
_GIT_ID = ["-c", "user.name=npuport", "-c", "user.email=npuport@localhost", "-c", "commit.gpgsign=false"]
# Every knob through which a repository's content or config could make git run a program.
_GIT_SAFE = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "diff.external=",
             "-c", "core.pager=cat", "-c", "core.attributesFile=/dev/null", "-c", "core.sshCommand=false",
             "-c", "core.editor=false", "-c", "sequence.editor=false", "-c", "protocol.allow=never",
             "-c", "credential.helper=", "-c", "gpg.program=false", "-c", "core.askPass=false",
             "-c", "safe.directory=*"]
# The repository's config as npuport writes it (rewritten before each call: sandboxed code may have written it).
_REPO_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
GIT_DIR_NAME = ".npuport-git"
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


_EMPTY_HOME = Path(tempfile.gettempdir()) / "npuport-git-home"


def git_env() -> dict[str, str]:
    """A fixed environment for git: nothing from the server's (no secrets, no GIT_* overrides)."""
    _EMPTY_HOME.mkdir(mode=0o700, exist_ok=True)
    return {"PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(_EMPTY_HOME), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
            "GIT_ATTR_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0", "GIT_PAGER": "cat", "PAGER": "cat",
            "GIT_EXTERNAL_DIFF": "", "LANG": "C", "LC_ALL": "C"}


def _sanitise(git_dir: Path) -> None:
    """Put back npuport's own config and drop hooks and attributes the model may have planted."""
    if not git_dir.is_dir():
        return
    (git_dir / "config").write_text(_REPO_CONFIG)
    for name in ("hooks", "info/attributes"):
        p = git_dir / name
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)


def safe_git(git_dir: Path, work_tree: Path, *args: str, input: bytes | None = None,
             check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run git on npuport's repository with a fixed environment and every exec hook disabled."""
    _sanitise(git_dir)
    if args and args[0] in ("diff", "show", "log") and "--no-ext-diff" not in args:
        # the external-diff and textconv settings are blanked, not unset: commands that diff must say so
        args = (args[0], "--no-ext-diff", "--no-textconv", *args[1:])
    argv = ["git", f"--git-dir={git_dir}", f"--work-tree={work_tree}", *_GIT_SAFE, *_GIT_ID, *args]
    r = subprocess.run(argv, cwd=work_tree, env=git_env(), capture_output=True, input=input)
    if check and r.returncode != 0:
        raise WorkspaceError(f"git {' '.join(args)} failed: {r.stderr.decode('utf-8', 'replace').strip()}")
    return r


def _checked_size(original: Path) -> int:
    """Bytes the copy will hold. Symlinks are followed only to files inside ``original`` (and counted);
    one that leaves it, dangles or names a folder is refused: a model folder must not smuggle in the
    host's files (a key, /etc/shadow) or a loop."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(original):
        here = Path(dirpath)
        ignored = _IGNORE(dirpath, dirnames + filenames)
        dirnames[:] = [d for d in dirnames if d not in ignored]
        for name in dirnames + filenames:
            p = here / name
            if name in ignored or not p.is_symlink():
                continue
            real = p.resolve()
            if not real.is_relative_to(original) or not real.is_file():
                to = "a folder or nothing" if real.is_relative_to(original) else "outside the model folder"
                raise WorkspaceError(f"{p.relative_to(original)} is a symlink to {to}; "
                                     "npuport copies only regular files inside the model folder")
        for name in filenames:
            if name not in ignored:
                total += (here / name).stat().st_size
    return total


@dataclass(frozen=True)
class Workspace:
    root: Path  # the workdir: model/ (git) + runs/

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def git_dir(self) -> Path:
        """npuport's repository: beside the model's tree, never inside it."""
        return self.root / GIT_DIR_NAME

    def has_repo(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    def git(self, *args: str, input: bytes | None = None) -> str:
        return safe_git(self.git_dir, self.model_dir, *args, input=input).stdout.decode("utf-8", "replace")

    @classmethod
    def create(cls, original: Path, root: Path) -> Workspace:
        original = original.resolve()
        ws = cls(root.resolve())
        if ws.model_dir.exists() and ws.has_repo():
            return ws  # resuming: the workspace already holds the original commit and the patches
        size = _checked_size(original)
        if size > MAX_COPY_BYTES:
            raise WorkspaceError(f"{original} holds {size // 2**20} MiB of files; npuport copies source trees up to "
                                 f"{MAX_COPY_BYTES // 2**20} MiB (weights are not needed)")
        ws.root.mkdir(parents=True, exist_ok=True)
        ws.runs_dir.mkdir(exist_ok=True)
        shutil.copytree(original, ws.model_dir, ignore=_IGNORE, symlinks=False, ignore_dangling_symlinks=True)
        subprocess.run(["git", "init", "-q", "-b", "npuport", "--bare", str(ws.git_dir)], env=git_env(),
                       capture_output=True, check=True)
        ws.git("add", "-A")
        ws.git("commit", "-q", "--allow-empty", "-m", "original model as given")
        ws.git("tag", "original")
        return ws

    def commit(self, message: str) -> str | None:
        """Commit every change; None when nothing changed."""
        self.git("add", "-A")
        if not self.git("status", "--porcelain").strip():
            return None
        self.git("commit", "-q", "-m", message)
        return self.head()

    def head(self) -> str:
        return self.git("rev-parse", "HEAD").strip()

    def diff_from_original(self) -> str:
        return self.ordered_diff("original", "HEAD")

    def ordered_diff(self, a: str, b: str) -> str:
        """``git diff a b`` with npuport's helper modules last (agents/fixing/helper_module.py): a reviewer reads
        the changes to the model's code first."""
        helpers = ":(glob)**/_npuport_helpers.py"
        body = self.git("diff", "--no-ext-diff", "--no-textconv", a, b, "--", ".",
                        ":(exclude,glob)**/_npuport_helpers.py")
        return body + self.git("diff", "--no-ext-diff", "--no-textconv", a, b, "--", helpers)

    def changed_files(self, commit: str) -> list[str]:
        out = self.git("show", "--no-ext-diff", "--no-textconv", "--name-only", "--pretty=format:", commit)
        return [line for line in out.splitlines() if line.strip()]

    def export_tree(self, dest: Path) -> None:
        """The patched tree, without git metadata."""
        shutil.copytree(self.model_dir, dest, ignore=shutil.ignore_patterns(".git", "__pycache__"), dirs_exist_ok=True)

    def original_tree(self, dest: Path) -> None:
        """The original as committed (for the reference run)."""
        if dest.exists():
            return
        dest.mkdir(parents=True)
        archive = safe_git(self.git_dir, self.model_dir, "archive", "original").stdout
        subprocess.run(["tar", "-x", "--no-same-owner", "-C", str(dest)], input=archive, check=True, env=git_env())

    def restore(self) -> bool:
        """Undo whatever was written into the model's tree since the last commit; True if anything was."""
        if not self.has_repo() or not self.git("status", "--porcelain").strip():
            return False
        self.git("checkout", "-q", "--", ".")
        self.git("clean", "-fdq")
        return True
