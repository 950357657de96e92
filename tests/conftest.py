"""Suite-wide set-up: each pytest-xdist worker is a node of its own (tests/node_worker.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

NODE_WORKER = Path(__file__).resolve().parent / "node_worker.py"


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist turns `-n N` into N "popen" specs; each becomes `python tests/node_worker.py ...`,
    # which starts the worker as pid 1 of its own PID namespace.
    tx = getattr(config.option, "tx", None)
    if tx and "PYTEST_XDIST_WORKER" not in os.environ:
        config.option.tx = [f"popen//python={sys.executable} {NODE_WORKER}" if spec == "popen" else spec
                            for spec in tx]
