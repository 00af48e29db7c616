"""The mutation run's list stays true to the code: every mutation in tools/mutate.py still applies
(its piece occurs exactly once in its file), so none silently stops testing anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_mutation_still_applies() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "mutate.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
