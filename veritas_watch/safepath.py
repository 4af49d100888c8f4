"""Files veritas-watch writes stay inside the directory they belong to.

`inside(root, path)` resolves both (symlinks followed, `..` folded) and raises `PathEscape` (an
OSError, so the callers' "cannot write" handling applies) when the file would land outside `root`:
a `CREDENTIALS_INDEX.md` that is a symlink to somewhere else, an archive dir linked out of the
workspace, a name with a `/` in it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class PathEscape(OSError):
    def __init__(self, path: Path, root: Path, real: str) -> None:
        super().__init__(errno.EPERM, f"refusing to write {path}: it resolves to {real}, outside {root}")


def inside(root: Path, path: Path) -> Path:
    """`path` (which need not exist) when it resolves to a place under `root`; else PathEscape."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != real_root and not real.startswith(real_root.rstrip("/") + "/"):
        raise PathEscape(path, root, real)
    return path


PRIVATE_DIR = 0o700  # the data dir and everything veritas-watch keeps for itself: only its owner enters


def make_dirs(path: Path, mode: int = PRIVATE_DIR) -> list[Path]:
    """`mkdir -p` giving every directory it creates exactly `mode`, whatever the umask: `parents=True` alone
    makes the parents 0o777 minus the umask (all of it under umask 000), and a mode is only ever narrowed by
    the umask, so each new directory is set again right after it is made (through a descriptor opened
    without following a symlink). Directories that exist already are left as they are; a file in the way
    raises FileExistsError, as `Path.mkdir(exist_ok=True)` does. Returns the directories it made, top first."""
    missing: list[Path] = []
    made: list[Path] = []
    probe = Path(path)
    while not os.path.lexists(probe) and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode)
        except FileExistsError:
            continue  # made meanwhile by someone else: theirs to keep as it is
        made.append(directory)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    if not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, "not a directory", str(path))
    return made
