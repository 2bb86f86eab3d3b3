"""pytest configuration of the Python package's tests: they need Python's torch, and skip, saying
so, only when it is missing. A missing or broken dropit build is an error, not a skip."""

import pytest

torch = pytest.importorskip("torch", reason="Python's torch is not installed "
                            "(python3 -m pip install torch); the Python package cannot be tested")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield
