"""The ctest entry of the Python tests: pytest over tests/python. Exits 77, which ctest reports as
skipped, only when Python's torch is missing; anything else that goes wrong fails."""

import os
import sys


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("SKIPPED: Python's torch is not installed (python3 -m pip install torch); "
              "the Python package was neither built nor tested")
        return 77
    import pytest

    here = os.path.dirname(os.path.abspath(__file__))
    return pytest.main(["-q", "-p", "no:cacheprovider", "-rs", here] + sys.argv[1:])


# The guard matters: the data-parallel test starts processes that import this module again.
if __name__ == "__main__":
    sys.exit(main())
