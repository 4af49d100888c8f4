"""Where the shared fixtures live: `../shared` next to the repository (tests skip when it is absent)."""

from __future__ import annotations

import os
from pathlib import Path


def shared_dir() -> Path | None:
    """The shared fixtures directory (`$VERITAS_SHARED_DIR`, else `<repo>/../shared`), or None if missing."""
    override = os.environ.get("VERITAS_SHARED_DIR")
    candidate = Path(override) if override else Path(__file__).resolve().parents[2] / "shared"
    return candidate if candidate.is_dir() else None
