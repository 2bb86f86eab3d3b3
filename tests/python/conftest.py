"""pytest configuration of the Python package's tests: they need Python's torch, and skip, saying
so, only when it is missing. A missing or broken dropit build is an error, not a skip."""

import atexit
import os
import shutil
import tempfile

import pytest

# The tests compile into a cache directory of their own, new each run, so that they compile this
# build's graphs rather than load what an earlier build or session cached (dropit keys the
# compiler's caches by its operators' schemas, but a test must not depend on that to pass).
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="dropit-inductor-")
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

torch = pytest.importorskip("torch", reason="Python's torch is not installed "
                            "(python3 -m pip install torch); the Python package cannot be tested")


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def _cuda_case():
    """The CUDA case of a test: skipped, saying so, without a CUDA device. With one, a dropit built
    without CUDA fails the test (its error names the missing backend)."""
    return pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: the CUDA case is skipped"))


@pytest.fixture(params=["cpu", _cuda_case()])
def device(request):
    """The device a test runs on: the CPU, then CUDA where there is a device."""
    return torch.device(request.param)
