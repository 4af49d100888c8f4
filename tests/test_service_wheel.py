"""`veritas-watch service install` from a wheel: the unit templates are package data (veritas_watch/systemd/), so an
installation made with pip has them; the checkout's systemd/ shows the same files (it links to them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tests.daemon_harness import REPO
from veritas_watch.service import UNIT_NAME

UNITS = (UNIT_NAME, "veritas-watch.user.service")


def test_the_checkouts_systemd_dir_shows_the_shipped_units() -> None:
    for name in UNITS:
        shipped = REPO / "veritas_watch" / "systemd" / name
        assert (REPO / "systemd" / name).read_bytes() == shipped.read_bytes(), name


def _run(*argv: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, check=False,
                            **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, (argv, result.stdout[-2000:], result.stderr[-2000:])
    return result  # type: ignore[no-any-return]


def test_a_wheel_installation_prints_its_unit(tmp_path: Path) -> None:
    # The wheel is built from a copy: an in-tree build would leave build/ in the checkout.
    source = tmp_path / "src"
    shutil.copytree(REPO / "veritas_watch", source / "veritas_watch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", source)
    [wheel] = (tmp_path / "dist").glob("veritas_watch-*.whl")
    # A scratch environment with this wheel installed and the test environment's packages as its dependencies
    # (a .pth line puts them on sys.path without running their .pth files: not the checkout's editable finder).
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (purelib / "test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel)
    state = tmp_path / "state"
    state.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERITAS_", "OPENCLAW_", "PYTHON"))}
    env["OPENCLAW_STATE_DIR"] = str(state)
    where = _run(python, "-c", "import veritas_watch; print(veritas_watch.__file__)", cwd=tmp_path, env=env)
    assert Path(where.stdout.strip()).is_relative_to(purelib)  # the wheel's copy, not the checkout
    for flags, unit in (((), UNIT_NAME), (("--user",), "veritas-watch.user.service")):
        printed = _run(venv / "bin" / "veritas-watch", "service", "install", "--print", *flags, cwd=tmp_path,
                       env=env).stdout
        assert f"ExecStart={venv / 'bin' / 'veritas-watch'} run" in printed
        assert f"Environment=OPENCLAW_STATE_DIR={state}" in printed
        assert "Documentation=" not in printed  # no README beside an installed package
        shipped = (REPO / "veritas_watch" / "systemd" / unit).read_text()
        kept = [line for line in shipped.splitlines() if line.startswith(("NoNewPrivileges=", "SystemCallFilter="))]
        assert kept and all(line in printed.splitlines() for line in kept)  # the shipped hardening
