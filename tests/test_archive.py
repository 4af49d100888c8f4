"""Daily-log archiver on real directories."""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import pytest
import structlog

from veritas_watch.features.archive import archive_daily_logs, daily_log_date

TODAY = date(2026, 3, 31)


def make_logs(workspace: Path, count: int, today: date = TODAY) -> list[Path]:
    """`count` daily logs, one a day, ending today; each holds its own name."""
    memory = workspace / "memory"
    memory.mkdir(parents=True, exist_ok=True)
    paths = []
    for age in range(count):
        path = memory / f"{today - timedelta(days=age):%Y-%m-%d}.md"
        path.write_text(f"log {path.name}\n", encoding="utf-8")
        paths.append(path)
    return paths


def names(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.is_file()} if directory.is_dir() else set()


def test_threshold_is_exclusive_thirty_files_stay(tmp_path: Path) -> None:
    make_logs(tmp_path, 30)
    assert archive_daily_logs(tmp_path, TODAY) == []
    assert len(names(tmp_path / "memory")) == 30
    assert not (tmp_path / "memory" / "archive").exists()


def test_thirty_one_files_move_those_older_than_keep_days(tmp_path: Path) -> None:
    make_logs(tmp_path, 31)  # ages 0..30
    with structlog.testing.capture_logs() as logs:
        moved = archive_daily_logs(tmp_path, TODAY)
    memory, archive = tmp_path / "memory", tmp_path / "memory" / "archive"
    expected = {f"{TODAY - timedelta(days=age):%Y-%m-%d}.md" for age in range(15, 31)}
    assert {source.name for source, _ in moved} == expected == names(archive)
    assert all(target == archive / source.name for source, target in moved)
    assert names(memory) == {f"{TODAY - timedelta(days=age):%Y-%m-%d}.md" for age in range(15)}
    for name in expected:  # contents travel with the file
        assert (archive / name).read_text(encoding="utf-8") == f"log {name}\n"
    archived = [entry for entry in logs if entry["event"] == "daily_log_archived"]
    assert len(archived) == 16


def test_fourteen_day_boundary(tmp_path: Path) -> None:
    make_logs(tmp_path, 31)
    archive_daily_logs(tmp_path, TODAY)
    fourteen = f"{TODAY - timedelta(days=14):%Y-%m-%d}.md"
    fifteen = f"{TODAY - timedelta(days=15):%Y-%m-%d}.md"
    assert (tmp_path / "memory" / fourteen).exists()
    assert (tmp_path / "memory" / "archive" / fifteen).exists()
    assert not (tmp_path / "memory" / fifteen).exists()


def test_never_overwrites_an_archived_file(tmp_path: Path) -> None:
    make_logs(tmp_path, 31)
    archive = tmp_path / "memory" / "archive"
    archive.mkdir()
    clash = f"{TODAY - timedelta(days=20):%Y-%m-%d}.md"
    (archive / clash).write_text("the older archived copy\n", encoding="utf-8")
    with structlog.testing.capture_logs() as logs:
        moved = archive_daily_logs(tmp_path, TODAY)
    assert clash not in {source.name for source, _ in moved}
    assert len(moved) == 15
    assert (archive / clash).read_text(encoding="utf-8") == "the older archived copy\n"
    assert (tmp_path / "memory" / clash).read_text(encoding="utf-8") == f"log {clash}\n"
    skipped = [entry for entry in logs if entry["event"] == "archive_skipped_exists"]
    assert [Path(entry["source"]).name for entry in skipped] == [clash]


def test_only_real_daily_logs_count(tmp_path: Path) -> None:
    make_logs(tmp_path, 30)
    memory = tmp_path / "memory"
    for extra in ["notes.md", "2026-02-30.md", "2026-01-01.txt", "2026-01-01.md.bak", "x2026-01-01.md"]:
        (memory / extra).write_text("not a daily log\n", encoding="utf-8")
    (memory / "2025-12-01.md").mkdir()  # a directory with a daily name
    (memory / "2025-12-02.md").symlink_to(memory / "notes.md")  # a symlink with a daily name
    assert archive_daily_logs(tmp_path, TODAY) == []
    (memory / "2025-11-30.md").write_text("a real one\n", encoding="utf-8")  # 31 real logs now
    moved = archive_daily_logs(tmp_path, TODAY)
    assert "2025-11-30.md" in {source.name for source, _ in moved}
    assert (memory / "notes.md").exists() and (memory / "2026-02-30.md").exists()
    assert (memory / "2025-12-02.md").is_symlink()


def test_parameters_and_future_dates(tmp_path: Path) -> None:
    make_logs(tmp_path, 5, today=TODAY + timedelta(days=2))  # two dated in the future
    moved = archive_daily_logs(tmp_path, TODAY, keep_days=1, threshold=4)
    assert {source.name for source, _ in moved} == {"2026-03-29.md"}  # age 2 > 1; ages <= 1 stay


def test_missing_memory_dir_and_unusable_archive(tmp_path: Path) -> None:
    assert archive_daily_logs(tmp_path / "nowhere", TODAY) == []
    make_logs(tmp_path, 31)
    (tmp_path / "memory" / "archive").write_text("a file in the way\n", encoding="utf-8")
    with structlog.testing.capture_logs() as logs:
        assert archive_daily_logs(tmp_path, TODAY) == []
    assert [entry["event"] for entry in logs] == ["archive_dir_unusable"]
    assert len(names(tmp_path / "memory")) == 32


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("2026-03-17.md", date(2026, 3, 17)),
        ("2026-02-29.md", None),
        ("2026-3-17.md", None),
        ("2026-03-17.MD", None),
        ("memory-2026-03-17.md", None),
    ],
)
def test_daily_log_names(name: str, expected: date | None) -> None:
    assert daily_log_date(name) == expected


def test_second_run_is_a_no_op(tmp_path: Path) -> None:
    make_logs(tmp_path, 40)
    first = archive_daily_logs(tmp_path, TODAY)
    assert len(first) == 25
    assert archive_daily_logs(tmp_path, TODAY) == []  # 15 left: under the threshold
