"""Unit tests run the library on the in-memory fabric (tests/fakeverbs), never on a device."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fakeverbs"))
