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
