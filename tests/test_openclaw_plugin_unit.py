"""The OpenClaw plugin's own unit tests (`integrations/openclaw/test/*.test.js`), run by `node --test`.

They run with the Node that `tests.openclaw_harness.install()` provides (the one OpenClaw 2026.9.6 runs
on), so `bin/test` runs them in CI like every other test. Skipped, with the reason, only where the npm
registry cannot be reached to install it and `CI` is not set.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.openclaw_harness import install_or_skip

PLUGIN = Path(__file__).resolve().parents[1] / "integrations" / "openclaw"


def test_plugin_unit_tests_pass_under_node_test(tmp_path: Path) -> None:
    found = install_or_skip()
    files = sorted(str(p.relative_to(PLUGIN)) for p in (PLUGIN / "test").glob("*.test.js"))
    assert len(files) >= 4, files
    env = {"PATH": f"{found.node_bin}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(tmp_path),
           "TMPDIR": str(tmp_path), "NO_COLOR": "1"}
    proc = subprocess.run([str(found.node_bin / "node"), "--test", "--test-reporter=tap", *files], cwd=PLUGIN,
                          env=env, capture_output=True, text=True, timeout=300)
    failed = [line.strip() for line in proc.stdout.splitlines() if line.lstrip().startswith("not ok")]
    counts = [line for line in proc.stdout.splitlines() if line.startswith(("# tests", "# pass", "# fail"))]
    assert proc.returncode == 0 and not failed, (
        f"node --test failed: {failed}\n{counts}\n{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}")
    assert "# fail 0" in counts and any(c.startswith("# pass") for c in counts), counts
