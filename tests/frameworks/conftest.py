"""pytest wiring for the framework suite (see harness.py and docs/testing.md)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def pytest_report_header(config):
    return [
        f"cuquota frameworks: {harness.DEVICE}; shim {harness.SHIM}",
        f"python {sys.version.split()[0]} at {sys.prefix}",
    ]


@pytest.fixture(autouse=True)
def _built():
    harness.require_builds()


@pytest.fixture
def box(tmp_path):
    return harness.Box(tmp_path)
