"""`veritas-watch service install|uninstall [--user] [--print]`: the systemd unit for this installation.

The shipped units (package data, veritas_watch/systemd/*.service; systemd/ in a checkout links to them) keep their
hardening; install fills in what differs per machine: the
console script of this environment (ExecStart=), the owner of the OpenClaw state dir (User=, Group=), that
state dir (Environment=OPENCLAW_STATE_DIR=, ReadWritePaths=). Local changes go in a drop-in that install
creates once and never overwrites. Pure core (`render_unit`, `systemd_quote`), thin shell (`install`, `uninstall`).
"""

from __future__ import annotations

import argparse
import dataclasses
import grp
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from veritas_watch.config import Config, default_data_dir
from veritas_watch.openclaw import resolve_state_dir
from veritas_watch.safepath import make_dirs

SERVICE = "veritas-watch"
UNIT_NAME = f"{SERVICE}.service"
TEMPLATES = "systemd"  # the shipped units: package data of veritas_watch, in a wheel as in a checkout
CHECKOUT = Path(__file__).resolve().parents[1]  # the checkout, when this runs from one (its README is the docs)
SYSTEM_UNIT_DIR = Path("/etc/systemd/system")
UNIT_DIR_MODE = 0o755  # what a plain mkdir gives under the usual umask: systemd and the user read units there
DROP_IN = "local.conf"
SYSTEM_DATA_DIR = Path("/var/lib") / SERVICE  # StateDirectory= of the system unit
EXIT_REFUSED = 1

LOCAL_CONF = f"""\
# Local changes to {UNIT_NAME}, kept across `veritas-watch service install` (which rewrites the unit
# itself and never this file). After editing: systemctl{{user}} daemon-reload && systemctl{{user}} restart {SERVICE}
# Examples:
#[Service]
#Environment=VERITAS_WATCH_CONFIG=/etc/veritas-watch/config.toml
#ReadWritePaths=-/srv/openclaw-shared
"""


class ServiceError(Exception):
    """A refusal: one line saying what is missing and what to do."""


@dataclass(frozen=True)
class Installation:
    """What the unit says about this machine."""

    exec_start: Path  # the console script
    state_dir: Path  # the OpenClaw state dir: Environment= and ReadWritePaths=
    user: str  # owner of the state dir (User=, system unit only)
    group: str
    user_unit: bool  # `systemctl --user`
    # A user unit's data dir, named explicitly: StateDirectory= of a user unit is ~/.config on systemd < 254 (seen
    # on 252), ~/.local/state later, and the CLI looks in $XDG_STATE_HOME/veritas-watch.
    data_dir: Path | None = None
    namespaces: bool = True  # False: the user manager cannot set up namespaces here (status 218/226)


# -- the pure core ---------------------------------------------------------------------------------

# The user template's namespace-based hardening: a user manager needs unprivileged user namespaces for it.
NAMESPACE_KEYS = ("PrivateTmp", "ProtectSystem", "ProtectHome", "ReadWritePaths", "ProtectKernelTunables",
                  "ProtectKernelModules", "ProtectControlGroups")
NAMESPACE_FAILURES = ("218", "226")  # ExecMainStatus: CAPABILITIES, NAMESPACE

_NEEDS_QUOTES = re.compile(r'[\s"\'\\;]')


def systemd_quote(value: str, *, exec_line: bool = False) -> str:
    """One word for a unit file (systemd.syntax(7)): `%` doubled (specifiers), quoted with `\\` and `"` escaped
    when it holds whitespace, quotes, a backslash or a `;`. In a command line `$` is doubled too (no expansion)."""
    value = value.replace("%", "%%")
    if exec_line:
        value = value.replace("$", "$$")
    if value and not _NEEDS_QUOTES.search(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_unit(template: str, inst: Installation) -> str:
    """The shipped unit with this installation's program, user and state dir; every other line as shipped."""
    state = str(inst.state_dir)
    command = "veritas-watch service install" + (" --user" if inst.user_unit else "")
    header = [f"# Written by `{command}`: it rewrites this file;",
              f"# put local changes in {UNIT_NAME}.d/{DROP_IN} (kept across installs)."]
    out: list[str] = []
    add_env = "Environment=OPENCLAW_STATE_DIR=" not in template  # the user template names none: added below
    for line in template.splitlines():
        key = line.split("=", 1)[0] if "=" in line and not line.startswith("#") else ""
        if line.startswith("#") and not out:
            continue  # the template's install notes (edit these paths by hand): replaced by the header
        if not out:
            out.extend(header)
        if key == "Documentation":  # the template's points at an example path
            readme = CHECKOUT / "README.md"
            if readme.is_file() and (CHECKOUT / "pyproject.toml").is_file():  # not a README beside site-packages
                out.append("Documentation=" + readme.as_uri().replace("%", "%%"))  # a URI: spaces as %20
            continue
        if not inst.namespaces and key in NAMESPACE_KEYS:
            out.append(f"#{line}  (off: this user manager cannot set up namespaces)")
        elif key == "ExecStart":
            out.append(f"ExecStart={systemd_quote(str(inst.exec_start), exec_line=True)} run")
        elif key in ("User", "Group"):
            if not inst.user_unit:
                out.append(f"{key}={systemd_quote(inst.user if key == 'User' else inst.group)}")
        elif key == "Environment" and "OPENCLAW_STATE_DIR=" in line:
            out.append(f"Environment={systemd_quote('OPENCLAW_STATE_DIR=' + state)}")
        elif key == "ReadWritePaths":
            out.append(f"ReadWritePaths={systemd_quote('-' + state)}")
            if inst.data_dir is not None:
                out.append(f"ReadWritePaths={systemd_quote(str(inst.data_dir))}")
        else:
            out.append(line)
            if line.startswith("Environment=VERITAS_WATCH_LOG_FORMAT") and add_env:
                # the user template names no state dir (OpenClaw's default in %h): this one is explicit
                out.append(f"Environment={systemd_quote('OPENCLAW_STATE_DIR=' + state)}")
                if inst.data_dir is not None:
                    out.append(f"Environment={systemd_quote(f'VERITAS_WATCH_DATA_DIR={inst.data_dir}')}")
    return "\n".join(out) + "\n"


def blocked_for(path: Path, uid: int, gids: Sequence[int]) -> Path | None:
    """The first directory on the way to `path` (or `path` itself) that user `uid` cannot pass: execute on each
    directory, read and execute on the file. None when it can run it."""
    if uid == 0:
        return None
    parts = [*reversed(path.parents), path]
    for i, part in enumerate(parts):
        try:
            st = part.stat()
        except OSError:
            return part
        need = 0o1 if i < len(parts) - 1 else 0o5  # x to pass a directory; r and x to run a script
        shift = 6 if st.st_uid == uid else 3 if st.st_gid in gids else 0
        if (st.st_mode >> shift) & need != need:
            return part
    return None


# -- the shell -------------------------------------------------------------------------------------

def console_script() -> Path:
    """This environment's `veritas-watch`: the one beside the running interpreter, else the running script."""
    for candidate in (Path(sys.prefix) / "bin" / "veritas-watch", Path(sys.argv[0])):
        if candidate.name == "veritas-watch" and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.absolute()
    found = shutil.which("veritas-watch")
    if found is None:
        raise ServiceError("no veritas-watch console script found in this environment (pip install it first)")
    return Path(found).absolute()


def interpreter_of(script: Path) -> Path | None:
    """The program a `#!` line names (a venv's python, resolved: the user must reach the real interpreter)."""
    try:
        first = script.read_bytes()[:256].split(b"\n", 1)[0]
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return Path(words[0]).resolve() if words else None


def find_state_dir(config: Config, given: str | None, environ: Mapping[str, str]) -> Path:
    """--state-dir, else the config's (paths.state_dir, OPENCLAW_STATE_DIR), else OpenClaw's default for the
    invoking user: under sudo, SUDO_USER's home, not root's."""
    if given:
        return Path(given).expanduser().absolute()
    if config.paths.state_dir or environ.get("OPENCLAW_STATE_DIR") or environ.get("CLAWDBOT_STATE_DIR"):
        return config.state_dir.absolute()
    sudo_user = environ.get("SUDO_USER")
    if os.geteuid() == 0 and sudo_user and sudo_user != "root":
        with_home = {**environ, "HOME": pwd.getpwnam(sudo_user).pw_dir}
        return resolve_state_dir(with_home).absolute()
    return resolve_state_dir(environ).absolute()


def installation(config: Config, args: argparse.Namespace, environ: Mapping[str, str]) -> Installation:
    state_dir = find_state_dir(config, args.state_dir, environ)
    if not state_dir.is_dir():
        raise ServiceError(f"no OpenClaw state dir at {state_dir}: pass --state-dir, or set OPENCLAW_STATE_DIR "
                           "(run OpenClaw once first: it creates it)")
    st = state_dir.stat()
    try:
        owner = pwd.getpwuid(st.st_uid)
    except KeyError:
        raise ServiceError(f"{state_dir} belongs to uid {st.st_uid}, which has no user name here") from None
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = grp.getgrgid(owner.pw_gid).gr_name
    script = console_script()
    if not args.user:
        gids = os.getgrouplist(owner.pw_name, owner.pw_gid)
        for program in (script, interpreter_of(script)):
            if program is None:
                continue
            blocked = blocked_for(program, owner.pw_uid, gids)
            if blocked is not None:
                raise ServiceError(
                    f"user {owner.pw_name} (owner of {state_dir}) cannot run {program}: {blocked} is closed to it "
                    f"(mode {stat.S_IMODE(blocked.stat().st_mode):04o}). Install veritas-watch where that user can "
                    "reach it, e.g. python3 -m venv /opt/veritas-watch/.venv && /opt/veritas-watch/.venv/bin/pip "
                    "install <this checkout>, then run that environment's veritas-watch service install")
    data_dir = None
    if args.user:
        data_dir = default_data_dir({k: v for k, v in environ.items() if k != "STATE_DIRECTORY"}).absolute()
    return Installation(script, state_dir, owner.pw_name, group, bool(args.user), data_dir)


def unit_dir(user_unit: bool, environ: Mapping[str, str]) -> Path:
    if not user_unit:
        return SYSTEM_UNIT_DIR
    config_home = Path(environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "systemd" / "user"


def template(user_unit: bool) -> str:
    from importlib import resources

    name = "veritas-watch.user.service" if user_unit else UNIT_NAME
    try:
        return resources.files("veritas_watch").joinpath(TEMPLATES, name).read_text(encoding="utf-8")
    except OSError:
        raise ServiceError(f"the shipped unit {TEMPLATES}/{name} is missing from this installation of veritas-watch: "
                           "reinstall it (pip install --force-reinstall veritas-watch)") from None


def systemctl(user_unit: bool, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = ["systemctl", *(["--user"] if user_unit else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    if check and result.returncode != 0:
        raise ServiceError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{(result.stderr or result.stdout).strip()[-500:]}")
    return result


def require_manager(user_unit: bool) -> None:
    """Refuse before writing anything when no systemd would take the unit."""
    if shutil.which("systemctl") is None:
        raise ServiceError("systemctl not found: this machine does not run systemd")
    if user_unit:
        answer = systemctl(True, "show-environment", check=False)
        if answer.returncode != 0:
            raise ServiceError("no user manager answers (systemctl --user: "
                               f"{(answer.stderr or answer.stdout).strip()[:200]}). Log in through a session that "
                               "starts one (ssh, a desktop; not su/sudo), or as root: loginctl enable-linger <user>")
        return
    if os.geteuid() != 0:
        raise ServiceError("installing the system service needs root: sudo veritas-watch service install "
                           "(or --user for a user service)")
    if not Path("/run/systemd/system").is_dir():
        raise ServiceError("systemd is not running as the init system here (/run/systemd/system is missing)")


def write_if_changed(path: Path, text: str) -> bool:
    """Atomically replace `path` with `text` (0644); False if it already said exactly that."""
    if path.is_file() and path.read_text() == text:
        return False
    make_dirs(path.parent, UNIT_DIR_MODE)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


def install(config: Config, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    inst = installation(config, args, environ)
    unit_text = render_unit(template(inst.user_unit), inst)
    if args.print:
        sys.stdout.write(unit_text)
        return 0
    require_manager(inst.user_unit)
    scope = " --user" if inst.user_unit else ""
    unit_path = unit_dir(inst.user_unit, environ) / UNIT_NAME
    drop_in = unit_path.with_name(UNIT_NAME + ".d") / DROP_IN
    if inst.data_dir is not None:
        make_dirs(inst.data_dir)  # ReadWritePaths= needs it to exist
    changed = write_if_changed(unit_path, unit_text)
    created = not drop_in.exists()
    if created:
        make_dirs(drop_in.parent, UNIT_DIR_MODE)
        drop_in.write_text(LOCAL_CONF.format(user=scope))
    was_active = systemctl(inst.user_unit, "is-active", "--quiet", SERVICE, check=False).returncode == 0
    systemctl(inst.user_unit, "daemon-reload")
    systemctl(inst.user_unit, "enable", SERVICE)
    action = "restart" if changed and was_active else "start"
    started = systemctl(inst.user_unit, action, SERVICE, check=False)
    status = systemctl(inst.user_unit, "show", "-p", "ExecMainStatus", "--value", SERVICE, check=False).stdout.strip()
    if started.returncode != 0 and inst.user_unit and status in NAMESPACE_FAILURES:
        # Seen in a user manager that cannot set up namespaces: the seccomp hardening stays, the rest goes.
        print(f"note:     the user manager could not set up namespaces (status {status}): installed without "
              f"{', '.join(NAMESPACE_KEYS)}")
        inst = dataclasses.replace(inst, namespaces=False)
        changed = write_if_changed(unit_path, render_unit(template(True), inst)) or changed
        systemctl(True, "daemon-reload")
        systemctl(True, "reset-failed", SERVICE, check=False)
        started = systemctl(True, "restart", SERVICE, check=False)
    state = systemctl(inst.user_unit, "show", "-p", "ActiveState", "-p", "SubState", "--value", SERVICE,
                      check=False).stdout.split()
    data_dir = inst.data_dir or SYSTEM_DATA_DIR
    print(f"unit:     {unit_path} ({'written' if changed else 'unchanged'})")
    print(f"drop-in:  {drop_in} ({'created' if created else 'kept: your local changes'})")
    print(f"runs:     {inst.exec_start} run" + ("" if inst.user_unit else f" as {inst.user}:{inst.group}"))
    print(f"watches:  {inst.state_dir}")
    print(f"data:     {data_dir}")
    print(f"done:     systemctl{scope} daemon-reload; systemctl{scope} enable {SERVICE}; "
          f"systemctl{scope} {action} {SERVICE}")
    print(f"state:    {' '.join(state) or 'unknown'}")
    journal = f"journalctl{' --user' if inst.user_unit else ''} -u {SERVICE} -f"
    if started.returncode != 0:
        print(f"veritas-watch: {SERVICE} did not start: {(started.stderr or '').strip()[-300:]}\n"
              f"  see: systemctl{scope} status {SERVICE}; {journal}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"logs:     {journal}")
    print("check:    veritas-watch doctor" + ("" if inst.user_unit else f" (as {inst.user})"))
    return 0


def uninstall(config: Config, args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> int:
    del config
    require_manager(bool(args.user))
    scope = " --user" if args.user else ""
    unit_path = unit_dir(bool(args.user), environ) / UNIT_NAME
    drop_in = unit_path.with_name(UNIT_NAME + ".d") / DROP_IN
    if not unit_path.exists():
        print(f"{unit_path}: not installed, nothing to do")
        return 0
    systemctl(bool(args.user), "disable", "--now", SERVICE, check=False)  # stopped: it commits its cursors
    unit_path.unlink()
    print(f"stopped and disabled {SERVICE}; removed {unit_path}")
    if drop_in.is_file() and drop_in.read_text() == LOCAL_CONF.format(user=scope):
        drop_in.unlink()
        with_others = any(drop_in.parent.iterdir())
        if not with_others:
            drop_in.parent.rmdir()
    elif drop_in.is_file():
        print(f"kept {drop_in}: it holds your local changes")
    systemctl(bool(args.user), "daemon-reload")
    data_dir = SYSTEM_DATA_DIR if not args.user else default_data_dir(
        {k: v for k, v in environ.items() if k != "STATE_DIRECTORY"})
    print(f"kept the data dir {data_dir} (memory, cursors, keys): a new install goes on from it; remove it by hand "
          "to forget everything")
    return 0


def cmd_service(config: Config, args: argparse.Namespace) -> int:
    """`veritas-watch service install|uninstall` (its arguments: cli._parser)."""
    try:
        return install(config, args) if args.service_command == "install" else uninstall(config, args)
    except ServiceError as exc:
        print(f"veritas-watch: {exc}", file=sys.stderr)
        return EXIT_REFUSED
