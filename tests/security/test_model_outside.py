"""Class: nothing of the model runs outside the sandbox. A layered env holds wheels the model's imports
chose, and a wheel can carry a ``.pth``: starting that env's interpreter runs it. Every question npuport
asks such an interpreter (versions for the bundle, missing transformers names, the torch build for the
native engine, the torch pair probe) runs under bwrap, so the .pth runs confined too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox.isolation.process import bwrap_available


@pytest.fixture()
def hostile_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A venv whose site-packages carries a .pth that, when the interpreter starts, writes a marker
    next to the server's files (the test's folder, which a confined run cannot reach)."""
    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it)")
    monkeypatch.setenv("NPUPORT_ISOLATION", "auto")
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # never plant the .pth anywhere but this venv (the base interpreter's site-packages is shared)
    assert Path(site).is_relative_to(venv), site
    marker = tmp_path / "outside" / "pwned"
    marker.parent.mkdir()
    (Path(site) / "evil.pth").write_text(
        f"import os; open({str(marker)!r}, 'a').write('ran as uid %d\\n' % os.getuid())\n")
    # the .pth does run when the interpreter starts unconfined (the attack is real)
    subprocess.run([str(py), "-c", "pass"], check=True)
    assert marker.exists()
    marker.unlink()
    return str(py), marker


def test_bundle_version_probe_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from agents.deploy.requirements import env_versions

    py, marker = hostile_env
    env_versions(py, ["pip"])
    assert not marker.exists(), marker.read_text()


def test_torch_identity_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from knowledge.errors import NativeUnavailable
    from sandbox.ascend_sim.native_build import _torch_identity

    py, marker = hostile_env
    with pytest.raises(NativeUnavailable):  # no torch in this env; the .pth ran first either way
        _torch_identity(py)
    assert not marker.exists(), marker.read_text()


def test_torch_pair_probe_runs_the_env_confined(hostile_env: tuple[str, Path]) -> None:
    from agents.environment.torch_pair import probe

    py, marker = hostile_env
    ok, _ = probe(py, [], timeout_s=60)
    assert not ok and not marker.exists()


def test_purelib_question_runs_no_pth(hostile_env: tuple[str, Path]) -> None:
    from agents.environment.layered import purelib

    py, marker = hostile_env
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert purelib(Path(py)) == str(Path(py).parent.parent / "lib" / version / "site-packages")
    assert not marker.exists()


def test_a_probe_sees_no_host_secret_and_cannot_write(hostile_env: tuple[str, Path], tmp_path: Path) -> None:
    from sandbox.isolation.probe import run_probe

    py, _ = hostile_env
    secret = tmp_path / "outside" / "token.txt"
    secret.write_text("server-token-19ab")
    code = (f"import os\ntry:\n    print(open({str(secret)!r}).read())\nexcept OSError as e:\n    print('no', e)\n"
            "print('uid', os.getuid())")
    done = run_probe([py, "-c", code], timeout=30)
    assert "server-token-19ab" not in done.stdout and "uid 0" not in done.stdout, done.stdout


# --- installs and builds: a wheel's .pth never runs outside the sandbox --------------------------------

def _wheel(folder: Path, name: str, pth: str = "") -> Path:
    """A minimal pure wheel; with ``pth``, it installs a .pth that runs at every start of the env."""
    import zipfile

    dist = f"{name}-1.0.dist-info"
    files = {f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: 1.0\n",
             f"{dist}/WHEEL": ("Wheel-Version: 1.0\nGenerator: npuport-tests\nRoot-Is-Purelib: true\n"
                               "Tag: py3-none-any\n"),
             f"{name}.py": "VALUE = 1\n"}
    if pth:
        files[f"{name}_hook.pth"] = pth
    files[f"{dist}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{dist}/RECORD"])
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for f, data in files.items():
            zf.writestr(f, data)
    return path


def _layered_venv(root: Path) -> Path:
    """A venv layered on npuport's site-packages (pip comes from there), as agents/environment/layered.py builds one."""
    from agents.environment.compat import host_site_dirs
    from agents.environment.layered import purelib as _purelib

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = root / "bin" / "python"
    (Path(_purelib(py)) / "_npuport_layer.pth").write_text(
        f"import site; list(map(site.addsitedir, {host_site_dirs()!r}))\n")
    return py


HOOK = '''
import os, socket, sys
out = []
try:
    open({marker!r}, "a").write("ran outside as uid %d\\n" % os.getuid())
    out.append("wrote outside")
except OSError as e:
    out.append("outside write refused")
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    out.append("direct: connected")
except OSError as e:
    out.append("direct: refused")
proxy = os.environ.get("HTTPS_PROXY", "")
if proxy:
    try:
        host, port = proxy.rsplit("/", 1)[-1].split(":")
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        out.append("proxy: " + s.recv(100).decode(errors="replace").splitlines()[0])
    except OSError as e:
        out.append("proxy: " + type(e).__name__)
open(os.path.join(sys.prefix, "hook-ran.txt"), "a").write("; ".join(out) + "\\n")
'''


def test_layered_env_installs_run_in_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model's wheel carries a .pth. Installing into its env runs the env's interpreter again (the next
    requirement, the guarded imports, pip check): the .pth runs then, confined: it writes nothing outside
    the env folder and reaches no host but the package index (here: nothing at all)."""
    import socket

    from agents.environment.layered import run_pip as _run_pip

    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it)")
    monkeypatch.setenv("NPUPORT_ISOLATION", "auto")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    marker = tmp_path / "outside" / "pwned"
    marker.parent.mkdir()
    env = tmp_path / "env"
    py = _layered_venv(env)
    wheels = env / "wheels"  # inside the env folder: the only place the install sees besides the index
    wheels.mkdir()
    hook = "import os; exec(" + repr(HOOK.format(marker=str(marker), port=port)) + ")\n"
    evil, plain = _wheel(wheels, "npuport_evil_pth", hook), _wheel(wheels, "npuport_plain")
    constraints = env / "npuport-constraints.txt"
    constraints.write_text("")
    first = _run_pip(py, [str(evil)], constraints, 300)
    assert first.returncode == 0, first.stderr[-2000:]
    second = _run_pip(py, [str(plain)], constraints, 300)  # pip now starts with the .pth installed
    server.close()
    assert second.returncode == 0, second.stderr[-2000:]
    ran = (env / "hook-ran.txt").read_text()
    assert "outside write refused" in ran and not marker.exists(), ran
    assert "direct: refused" in ran, ran
    assert "proxy: HTTP/1.1 200" not in ran, ran  # the index proxy lets no other host through
    from agents.environment.era import broken_host_packages

    broken_host_packages(py)  # pip check: the .pth runs again, confined
    assert not marker.exists()


def test_native_engine_build_runs_in_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ascend-sim's engine is compiled by the env's interpreter (its .pth runs first): the build is confined,
    with a scrubbed environment (no server secret reaches it)."""
    from knowledge.errors import NativeUnavailable
    from sandbox.ascend_sim.native_build import _torch_identity, library_path

    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it)")
    monkeypatch.setenv("NPUPORT_ISOLATION", "auto")
    monkeypatch.setenv("NPUPORT_NATIVE_CACHE", str(tmp_path / "native"))
    monkeypatch.setenv("NPUPORT_LLM_API_KEY", "sk-server-secret-4242")
    monkeypatch.setenv("CXX", "false")  # the compile fails at once: the .pth has run by then
    py = _layered_venv(tmp_path / "env")
    marker = tmp_path / "outside" / "pwned"
    marker.parent.mkdir()
    code = f"import os\ntry:\n    open({str(marker)!r}, 'a').write(repr(dict(os.environ)))\nexcept OSError:\n    pass\n"
    from agents.environment.layered import purelib as _purelib

    (Path(_purelib(py)) / "evil.pth").write_text("import os; exec(" + repr(code) + ")\n")
    _torch_identity.cache_clear()
    with pytest.raises(NativeUnavailable):
        library_path(python=str(py))
    assert not marker.exists(), marker.read_text()[:500]


def test_a_confined_install_reaches_the_index_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an http index configured, the confined pip reaches it through npuport's allow-list proxy (the
    install works); the same proxy refuses another host (a second local server)."""
    import functools
    import http.server
    import threading

    from agents.environment.layered import run_pip as _run_pip
    from sandbox.isolation import installs

    if bwrap_available() is None:
        pytest.skip("bubblewrap is not installed here (.ci/run installs it)")
    monkeypatch.setenv("NPUPORT_ISOLATION", "auto")
    index = tmp_path / "index"
    (index / "simple" / "npuport-plain").mkdir(parents=True)
    wheel = _wheel(index / "simple" / "npuport-plain", "npuport_plain")
    (index / "simple" / "npuport-plain" / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    servers = []
    for root in (index, tmp_path):
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
    index_port, other_port = (s.server_address[1] for s in servers)
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this pip knows only the test's index
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{index_port}/simple")
    try:
        assert installs.index_reach()[0] == {("127.0.0.1", index_port)}
        py = _layered_venv(tmp_path / "env")
        constraints = tmp_path / "env" / "npuport-constraints.txt"
        constraints.write_text("")
        done = _run_pip(py, ["npuport-plain"], constraints, 300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert list((tmp_path / "env").rglob("npuport_plain.py")), "the package was not installed"
        probe = ("import os, urllib.request\n"
                 f"for port in ({index_port}, {other_port}):\n"
                 "    try:\n"
                 "        print(port, urllib.request.urlopen(f'http://127.0.0.1:{port}/', timeout=10).status)\n"
                 "    except Exception as e:\n"
                 "        print(port, 'refused', getattr(e, 'code', type(e).__name__))\n")
        seen = installs.run_pip([str(py), "-c", probe], writable=(tmp_path / "env",), timeout=120)
        assert f"{index_port} 200" in seen.stdout and f"{other_port} refused 403" in seen.stdout, \
            seen.stdout + seen.stderr
    finally:
        for srv in servers:
            srv.shutdown()
