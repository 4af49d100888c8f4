"""Fixtures shared by several test files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

from tests.backends import BACKENDS, open_backend
from veritas_watch.sinks.store import Store

# CI draws the same property-test examples on every run (`CI=1`, .ci/run): a failure there is this commit's, not
# an example first drawn that day. Local runs draw new ones (`--hypothesis-seed=N` repeats one); what they find
# is fixed and kept as a plain test (test_redact.py's connection-string and seed-phrase cases came that way).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files marked `long` first: bin/test runs each file whole on one of two workers, and a long one
    started last would leave the other worker idle at the end."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: the rest keep their order


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store, once per backend (tests/backends.py); closed after the test."""
    backend = open_backend(request.param, tmp_path)
    yield backend
    backend.close()


@pytest.fixture(autouse=True)
def _openclaw_home_inside_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default agent's workspace is `$OPENCLAW_HOME/.openclaw/workspace`: never the real home in tests."""
    monkeypatch.setenv("OPENCLAW_HOME", str(tmp_path / "openclaw-home"))


@pytest.fixture(autouse=True)
def _structlog_defaults() -> None:
    """Each test starts from structlog's defaults: an in-process daemon's stop leaves logging at warning
    level, which hid a later test's info events from `capture_logs` when the tests ran in another order."""
    structlog.reset_defaults()
