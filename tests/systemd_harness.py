"""A real systemd (PID 1) booted over a throwaway copy of this machine's root, for tests/test_systemd_real.py.

`unshare --pid --fork --mount --uts --ipc --net --cgroup` gives it its own namespaces; its root is an overlay
with `/` as the (untouched) lower dir and a tmpfs as upper and work dir, with fresh /proc, /sys, cgroup2, /run,
/dev and, above all, /tmp: at boot systemd-tmpfiles empties /tmp, which over the host's own root wiped a
running job's files (issue 38). /proc/sys is read-only (no sysctl reaches the host), the hostname is its own,
its network namespace has only loopback (the daemon's port cannot meet another test's). Its cgroup tree is a
child of this process's cgroup2 one, killed and removed as a whole at the end. `container=` tells systemd it
is in a container (no udev, no getty, no hardware units). The host sees the overlay through /proc/<pid>/root.

Driven with `nsenter -t <pid> -m -p -u -i -n -r -w <command>`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")

BOOT = r"""
set -eu
R="$1"
mount -t tmpfs -o mode=0755 vw-systemd "$R"
mkdir "$R/upper" "$R/work" "$R/root"
mount -t overlay vw-overlay -o "lowerdir=/,upperdir=$R/upper,workdir=$R/work" "$R/root"
cd "$R/root"
mount -t proc proc proc
mount -t sysfs sysfs sys
mount -t cgroup2 cgroup2 sys/fs/cgroup
mount -t tmpfs -o mode=0755 tmpfs run
mount -t tmpfs -o mode=1777 tmpfs tmp
mount -t tmpfs -o mode=0755 tmpfs dev
for n in null zero full random urandom tty; do touch "dev/$n"; mount --bind "/dev/$n" "dev/$n"; done
mkdir dev/pts dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts dev/pts
ln -s pts/ptmx dev/ptmx
mount -t tmpfs tmpfs dev/shm
mount --bind proc/sys proc/sys
mount -o remount,bind,ro proc/sys
echo vw-systemd-test > etc/hostname
exec chroot . /usr/bin/env -i container=vw-test /lib/systemd/systemd --system --unit=multi-user.target
"""


def _filesystems() -> str:
    try:
        return Path("/proc/filesystems").read_text()
    except OSError:
        return ""


def _cgroup2_mount() -> Path | None:
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def unavailable() -> str | None:
    """Why a systemd cannot be booted here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root (unshare, mount, overlayfs)"
    for tool in ("unshare", "nsenter", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not SYSTEMD.exists():
        return f"{SYSTEMD} not found (apt-get install systemd)"
    if "overlay" not in _filesystems():
        return "the kernel has no overlayfs"
    if _cgroup2_mount() is None:
        return "no cgroup2 hierarchy mounted"
    return None


class BootedSystemd:
    """systemd as PID 1 of its own namespaces over an overlay of `/`. Use as a context manager."""

    def __init__(self) -> None:
        self.pid = 0
        self._launcher: subprocess.Popen[bytes] | None = None
        self._scratch = Path(tempfile.mkdtemp(prefix="vw-systemd-"))  # a mount point only, in its namespace
        cgroup_root = _cgroup2_mount()
        assert cgroup_root is not None
        own = Path("/proc/self/cgroup").read_text().splitlines()
        unified = next((line.split(":", 2)[2] for line in own if line.startswith("0::")), "/")
        self._cgroup = cgroup_root / unified.lstrip("/") / f"vw-systemd-{os.getpid()}-{time.monotonic_ns()}"

    @property
    def root(self) -> Path:
        """The booted machine's / as seen from the host (writes land in the overlay's upper dir)."""
        return Path(f"/proc/{self.pid}/root")

    def __enter__(self) -> BootedSystemd:
        self._cgroup.mkdir()
        self._launcher = subprocess.Popen(
            ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh", str(self._cgroup),
             "unshare", "--pid", "--fork", "--mount", "--uts", "--ipc", "--net", "--cgroup", "--propagation",
             "private", "--kill-child", "sh", "-c", BOOT, "boot", str(self._scratch)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while not self.pid:
                if self._launcher.poll() is not None:
                    out = self._launcher.stdout.read().decode() if self._launcher.stdout else ""
                    raise RuntimeError(f"systemd did not boot: {out[-2000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError("systemd did not start within 60 s")
                for pid in self._children(self._launcher.pid):
                    with contextlib.suppress(OSError):  # a child of the boot script may be gone already
                        # PID 1 of its namespace, once it is systemd (its forks are briefly "systemd" too)
                        status = Path(f"/proc/{pid}/status").read_text()
                        nspid = next(line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:"))
                        if nspid == "1" and Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                            self.pid = pid
                            break
                time.sleep(0.1)
            state = ""
            while not state and time.monotonic() < deadline + 120:  # empty: its bus is not up yet
                state = self.run("systemctl", "is-system-running", "--wait", check=False, timeout=180).stdout.strip()
                time.sleep(0 if state else 0.2)
            if state not in ("running", "degraded"):
                failed = self.run("systemctl", "--failed", "--no-pager", check=False).stdout
                raise RuntimeError(f"systemd booted to {state!r}: {failed}")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    @staticmethod
    def _children(pid: int) -> list[int]:
        found: list[int] = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                found.extend(int(c) for c in (task / "children").read_text().split())
        return found + [g for c in found for g in BootedSystemd._children(c)]

    def run(self, *argv: str, check: bool = True, timeout: float = 120, user: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`argv` inside the booted machine (its namespaces and root), as root or as `user` (runuser)."""
        prefix = ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", "-n", "-r", "-w"]
        environment = ["env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       *(f"{k}={v}" for k, v in (env or {}).items())]
        runas = ["runuser", "-u", user, "--"] if user else []
        result = subprocess.run([*prefix, *runas, *environment, *argv], capture_output=True, text=True,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
        return result

    def show(self, unit: str, *props: str, user: str | None = None,
             env: dict[str, str] | None = None) -> dict[str, str]:
        argv = ["systemctl", *(["--user"] if user else []), "show", unit, *(f"-p{p}" for p in props)]
        lines = self.run(*argv, user=user, env=env).stdout.splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)

    def journal(self, unit: str) -> list[str]:
        return self.run("journalctl", "-u", unit, "-o", "cat", "--no-pager").stdout.splitlines()

    def __exit__(self, *exc: object) -> None:
        # Every process of the booted machine is in its cgroup: killed at once, whatever state it is in.
        with contextlib.suppress(OSError):
            (self._cgroup / "cgroup.kill").write_text("1")
        if self._launcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._launcher.wait(timeout=30)
            if self._launcher.stdout is not None:
                self._launcher.stdout.close()
        for _ in range(100):  # the cgroups go once their processes are reaped
            leftovers = sorted((p for p in self._cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
            with contextlib.suppress(OSError):
                for directory in [*leftovers, self._cgroup]:
                    if directory.exists():
                        directory.rmdir()
            if not self._cgroup.exists():
                break
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            self._scratch.rmdir()  # its tmpfs went with the mount namespace
