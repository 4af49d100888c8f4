"""The daemon's exit code, chosen in one place (`daemon.exit_code`) for both ways a stop ends: the normal return
of `Daemon.run` and the overdue timer's `os._exit` (`Shutdown.exit_code`). The processes' codes themselves are
shown end to end in tests/test_e2e_daemon.py (an interrupted backfill exits 1)."""

from __future__ import annotations

from veritas_watch.daemon import EXIT_BACKFILL_INTERRUPTED, EXIT_DATA_DIR_GONE, exit_code


def test_one_choice_of_exit_code() -> None:
    assert exit_code(once=False, done=False) == 0  # `run` stopped: nothing was cut short
    assert exit_code(once=True, done=True) == 0  # a backfill whose pass ended
    assert exit_code(once=True, done=False) == EXIT_BACKFILL_INTERRUPTED == 1
    assert exit_code(once=False, done=False, data_dir_gone=True) == EXIT_DATA_DIR_GONE == 5
    assert exit_code(once=True, done=False, data_dir_gone=True) == EXIT_DATA_DIR_GONE  # the data dir comes first
