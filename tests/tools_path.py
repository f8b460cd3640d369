"""Importing this puts the repository's tools/ folder on sys.path (device-side checks reuse it)."""

import sys
from pathlib import Path

_TOOLS = str(Path(__file__).resolve().parent.parent / "tools")
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)
