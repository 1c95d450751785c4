"""Makes the harness importable as `bench` (it lives in Benchmarks/, beside these tests)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
