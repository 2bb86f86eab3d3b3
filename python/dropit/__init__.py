"""dropit: drop intermediate tensors (DropIT, ICLR 2023) to cut the activation memory of training.

Linear and Conv2d layers keep only the largest-magnitude fraction 1 - gamma of their input for the
weight gradient, stored compactly; the input gradient stays exact. The operations are dropit's C++
library (the LibTorch adapters in include/dropit/torch), bound as the extension ``dropit._C``.

    import dropit
    report = dropit.convert(model, gamma=0.9)   # in place, parameters shared
    print(report)

Bad arguments raise ``ValueError`` with the library's message, which names the value.
"""

# torch first: it loads the libtorch that the extension links against (the extension carries no
# search path of its own, and another libtorch on the system search path must not win).
import torch  # noqa: F401

from . import _C  # noqa: F401  (the compiled operations; fails loudly if the build is missing)
from . import _operators, functional, memory, nn
from ._policy import Policy
from .convert import ConvertReport, LayerReport, convert
from .plan import BlockPlan, MemoryPlan, plan_memory

_operators.tag_compile_caches()  # every operator is registered by now

__version__ = "0.1.0"

__all__ = ["BlockPlan", "ConvertReport", "LayerReport", "MemoryPlan", "Policy", "convert",
           "functional", "memory", "nn", "plan_memory"]
