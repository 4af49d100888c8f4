"""`veritas-watch service install`'s unit, rendered (a pure function): this installation's program, user and
state dir in the shipped template, quoted as systemd.syntax(7) reads them, every other line as shipped.
The command itself, under a real systemd: tests/test_systemd_real.py."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from veritas_watch.doctor import parse_unit, verify_unit
from veritas_watch.service import Installation, blocked_for, render_unit, systemd_quote, template

SUBSTITUTED = {"ExecStart", "User", "Group", "Environment", "ReadWritePaths", "Documentation"}


def render(state_dir: Path, program: Path, user_unit: bool = False) -> str:
    return render_unit(template(user_unit), Installation(program, state_dir, "claw user", "claw", user_unit))


@pytest.mark.parametrize(("raw", "word"), [
    ("/home/claw/.openclaw", "/home/claw/.openclaw"),
    ("/srv/open claw", '"/srv/open claw"'),
    ('/srv/a"b', '"/srv/a\\"b"'),
    ("/srv/a\\b", '"/srv/a\\\\b"'),
    ("/srv/100%", "/srv/100%%"),  # a specifier otherwise
    ("", '""'),
])
def test_quoting_follows_systemd_syntax(raw: str, word: str) -> None:
    assert systemd_quote(raw) == word


def test_a_command_line_does_not_expand_dollars() -> None:
    assert systemd_quote("/opt/$HOME/bin/veritas-watch", exec_line=True) == "/opt/$$HOME/bin/veritas-watch"


@pytest.mark.parametrize("user_unit", [False, True])
def test_unit_names_this_installation_and_keeps_everything_else(user_unit: bool) -> None:
    state, program = Path("/srv/open claw/state"), Path("/opt/veritas watch/.venv/bin/veritas-watch")
    text = render(state, program, user_unit)
    got, shipped = parse_unit(text), parse_unit(template(user_unit))
    assert got["ExecStart"] == ['"/opt/veritas watch/.venv/bin/veritas-watch" run']
    assert '"OPENCLAW_STATE_DIR=/srv/open claw/state"' in got["Environment"]
    assert got["ReadWritePaths"] == ['"-/srv/open claw/state"']
    if user_unit:  # a user manager runs as its user: no User=/Group=
        assert "User" not in got and "Group" not in got
    else:
        assert got["User"] == ['"claw user"'] and got["Group"] == ["claw"]
    # the hardening and every other directive exactly as shipped
    assert {k: v for k, v in got.items() if k not in SUBSTITUTED} == \
        {k: v for k, v in shipped.items() if k not in SUBSTITUTED}
    assert "/opt/veritas-watch" not in text and "%h/.local/share" not in text  # the template's example paths
    assert text.count("OPENCLAW_STATE_DIR=") == 1


@pytest.mark.parametrize("user_unit", [False, True])
def test_rendered_unit_verifies_with_spaces_in_its_paths(user_unit: bool, tmp_path: Path) -> None:
    """systemd itself reads the quoted words back: verify finds the program through its quoted path."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not available")
    script = Path(sys.executable).with_name("veritas-watch")
    if not script.exists():
        pytest.skip(f"console script {script} not installed (pip install -e .)")
    spaced = tmp_path / "veritas watch" / "bin"
    spaced.mkdir(parents=True)
    (spaced / "veritas-watch").symlink_to(script)
    state = tmp_path / "open claw"
    state.mkdir()
    unit = tmp_path / "veritas-watch.service"
    unit.write_text(render(state, spaced / "veritas-watch", user_unit).replace("User=\"claw user\"", "User=root")
                    .replace("Group=claw", "Group=root"))
    assert verify_unit(unit, user=user_unit) == []
    unit.write_text(unit.read_text().replace(f'"{spaced}/veritas-watch"', f"{spaced}/veritas-watch"))
    assert verify_unit(unit, user=user_unit), "an unquoted path with a space must not verify"


def test_a_program_the_service_user_cannot_reach_is_found(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    (closed / "bin").mkdir(parents=True)
    program = closed / "bin" / "veritas-watch"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    closed.chmod(0o700)
    other = 65534 if os.geteuid() != 65534 else 65533
    assert blocked_for(program, other, [other]) in (closed, *closed.parents)  # pytest's own dirs are 0700 too
    assert blocked_for(Path("/bin/sh").resolve(), other, [other]) is None
    closed.chmod(0o711)
    assert blocked_for(program, other, [other]) != closed
    assert blocked_for(program, os.geteuid(), [os.getegid()]) is None


def test_print_writes_the_unit_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "state dir"
    state.mkdir()
    result = subprocess.run([sys.executable, "-m", "veritas_watch.cli", "service", "install", "--print",
                             "--state-dir", str(state)], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert f'Environment="OPENCLAW_STATE_DIR={state}"' in result.stdout
    assert result.stdout.startswith("# Written by `veritas-watch service install`")


def test_a_user_unit_names_its_data_dir_and_can_go_without_namespaces() -> None:
    inst = Installation(Path("/usr/bin/veritas-watch"), Path("/home/c/.openclaw"), "c", "c", True,
                        Path("/home/c/.local/state/veritas-watch"))
    got = parse_unit(render_unit(template(True), inst))
    assert "VERITAS_WATCH_DATA_DIR=/home/c/.local/state/veritas-watch" in got["Environment"]
    assert got["ReadWritePaths"] == ["-/home/c/.openclaw", "/home/c/.local/state/veritas-watch"]
    bare = parse_unit(render_unit(template(True), dataclasses.replace(inst, namespaces=False)))
    assert not {"PrivateTmp", "ProtectSystem", "ProtectHome", "ReadWritePaths"} & set(bare)
    assert bare["SystemCallFilter"] == ["@system-service"] and bare["NoNewPrivileges"] == ["yes"]
