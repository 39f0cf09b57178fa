"""The torch backend's host tests: Debian's torch 1.13 (python3-torch) in .venv-torch, a venv
that sees the system's packages (`make test` runs them there; the main venv has no torch and
leaves this directory out). The library runs on the in-memory fabric, ranks as threads."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fakeverbs"))
