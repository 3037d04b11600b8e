"""Makes the suite's helpers (`mounts.py`) importable: pytest runs it with
`--import-mode=importlib`, which puts no test folder on `sys.path`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
