"""Rules of the e2e suite itself, checked on its source.

Tests wait for conditions (an access-log line, a recorded request, a closed socket), not for
time: `wait_until` in support.py, `until` in policy_support.py. A `time.sleep` stays only where
time passing is the point (a TTL, a backoff, a timeout that must fire), where it opens a window
in which something must NOT happen, in a purpose-built server's behaviour, or as a wait
helper's poll interval — and then a comment on its line or the line above says which.
"""

from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
REASONS = ("time passing", "window", "server behaviour", "poll interval")


def test_every_sleep_says_why():
    missing = []
    for path in sorted(HERE.glob("*.py")):
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            code = line.split("#", 1)[0]
            if not re.search(r"\btime\.sleep\(", code):
                continue
            said = line[len(code):] + " " + (lines[i - 1].strip() if i > 0 and lines[i - 1].strip().startswith("#") else "")
            if not any(reason in said.lower() for reason in REASONS):
                missing.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert not missing, "time.sleep without a reason (" + ", ".join(REASONS) + "):\n" + "\n".join(missing)
