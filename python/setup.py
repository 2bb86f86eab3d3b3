"""Builds dropit's Python package: the torch C++ extension dropit._C over the header-only library
in ../include (the LibTorch adapters of include/dropit/torch) and the pure-Python modules.

    python3 -m pip install --no-build-isolation ./python

--no-build-isolation builds against the torch already installed, the one the package will run with.
"""

import os
import re
import sys

from setuptools import setup

try:
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError:
    sys.exit("dropit: building the Python package needs PyTorch installed first "
             "(python3 -m pip install torch), then: python3 -m pip install --no-build-isolation ./python")

here = os.path.dirname(os.path.abspath(__file__))
include_dir = os.path.join(here, os.pardir, "include")
if not os.path.isfile(os.path.join(include_dir, "dropit", "torch.hpp")):
    sys.exit(f"dropit: the C++ headers are not at {include_dir}; build from a clone of the repository")


def project_version():
    """The version CMakeLists.txt declares: one number for the C++ library and the package."""
    with open(os.path.join(here, os.pardir, "CMakeLists.txt"), encoding="utf-8") as cmake:
        match = re.search(r"project\(dropit VERSION ([0-9.]+)", cmake.read())
    return match.group(1) if match else "0.0.0"


setup(
    name="dropit",
    version=project_version(),
    description="Drop intermediate tensors (DropIT) to cut the activation memory of training",
    packages=["dropit"],
    python_requires=">=3.9",
    ext_modules=[
        CppExtension(
            name="dropit._C",
            sources=["src/dropit_ext.cpp"],
            include_dirs=[include_dir],
            # C++20 for the library; OpenMP for its CPU backend (results do not depend on it);
            # hidden visibility, as pybind11 expects of the types it binds.
            extra_compile_args=["-std=c++20", "-O3", "-fopenmp", "-fvisibility=hidden"],
            extra_link_args=["-fopenmp"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
