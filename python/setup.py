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
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    sys.exit("dropit: building the Python package needs PyTorch installed first "
             "(python3 -m pip install torch), then: python3 -m pip install --no-build-isolation ./python")

# torch.library's fake kernels, register_fake and opcheck, which the operators rely on.
MIN_TORCH = (2, 4)
if tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) < MIN_TORCH:
    sys.exit(f"dropit: the Python package needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}; this "
             f"Python has torch {torch.__version__} (python3 -m pip install --upgrade torch)")

here = os.path.dirname(os.path.abspath(__file__))
include_dir = os.path.join(here, os.pardir, "include")
if not os.path.isfile(os.path.join(include_dir, "dropit", "torch.hpp")):
    sys.exit(f"dropit: the C++ headers are not at {include_dir}; build from a clone of the repository")


def project_version():
    """The version CMakeLists.txt declares: one number for the C++ library and the package."""
    with open(os.path.join(here, os.pardir, "CMakeLists.txt"), encoding="utf-8") as cmake:
        match = re.search(r"project\(dropit VERSION ([0-9.]+)", cmake.read())
    return match.group(1) if match else "0.0.0"


def build_with_cuda():
    """CUDA support when torch is a CUDA build and nvcc is there (DROPIT_CUDA=0 turns it off,
    DROPIT_CUDA=1 makes its absence an error)."""
    choice = os.environ.get("DROPIT_CUDA", "auto")
    if choice not in ("0", "1", "auto"):
        sys.exit(f"dropit: DROPIT_CUDA is {choice!r}; expected 0, 1 or auto")
    if choice == "0":
        return False
    nvcc = os.path.join(CUDA_HOME or "", "bin", "nvcc")
    missing = ("torch is a CPU-only build" if torch.version.cuda is None
               else None if os.path.isfile(nvcc) else f"no nvcc at {nvcc} (set CUDA_HOME)")
    if missing and choice == "1":
        sys.exit(f"dropit: DROPIT_CUDA=1 but {missing}")
    return missing is None


# C++20 for the library; OpenMP for its CPU backend (results do not depend on it); hidden
# visibility, as pybind11 expects of the types it binds; no debug information (Python's own flags
# ask for it, and it doubles the time to compile against torch's headers).
# DROPIT_CPU_INSTANCES: the CPU operations are compiled once, in src/cpu_instances.cpp.
cxx_flags = ["-std=c++20", "-O3", "-g0", "-fopenmp", "-fvisibility=hidden", "-DDROPIT_CPU_INSTANCES"]
cxx_sources = ["src/dropit_ext.cpp", "src/operators.cpp", "src/cpu_instances.cpp"]
common = dict(name="dropit._C", include_dirs=[include_dir], extra_link_args=["-fopenmp"])
if build_with_cuda():
    # Architectures: TORCH_CUDA_ARCH_LIST when set, else Ampere and Hopper.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0")
    extension = CUDAExtension(
        sources=cxx_sources + ["src/cuda_instances.cu"],
        define_macros=[("DROPIT_TORCH_CUDA", "1")],
        # The CUDA backend's linear weight gradient calls cuBLAS (the one torch loads at run time).
        libraries=["cublas"],
        extra_compile_args={
            "cxx": cxx_flags,
            # torch turns off CUDA's half and bfloat16 operators for its own sources; dropit's
            # kernels use them.
            "nvcc": ["-std=c++20", "-O3", "-U__CUDA_NO_HALF_OPERATORS__",
                     "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                     "-U__CUDA_NO_HALF2_OPERATORS__"],
        },
        **common,
    )
else:
    extension = CppExtension(sources=cxx_sources, extra_compile_args=cxx_flags, **common)

setup(
    name="dropit",
    version=project_version(),
    description="Drop intermediate tensors (DropIT) to cut the activation memory of training",
    packages=["dropit"],
    python_requires=">=3.9",
    ext_modules=[extension],
    cmdclass={"build_ext": BuildExtension},
)
