"""What a dropit layer keeps: a small, picklable value validated by the C++ library."""

from dataclasses import dataclass

import torch

from . import _C

POLICIES = ("chunked_min_k", "min_k", "random")
GRANULARITIES = ("element", "channel")


@dataclass(frozen=True)
class Policy:
    """Selection policy of a dropit layer.

    gamma: fraction of the cached input to drop, in [0, 1).
    policy: "chunked_min_k" (largest |x| per chunk of ``chunk_size`` elements, the default),
        "min_k" (largest |x| of the whole tensor) or "random" (uniform, positions regenerated
        from the seed in backward).
    granularity: "element", or "channel" (whole channels; min_k and random only).
    chunk_size: chunk length D of chunked_min_k and random, in [1, 65536].
    seed: seed of random selection; every forward call draws afresh from (seed, call number).
    rescale: scale kept values by n/k (random selection: an unbiased estimator).
    """

    gamma: float = 0.9
    policy: str = "chunked_min_k"
    granularity: str = "element"
    chunk_size: int = 16384
    seed: int = 0
    rescale: bool = False

    def __post_init__(self):
        # Raises ValueError naming any bad field. A policy made inside torch.compile's trace is
        # validated by the operators' fake kernels instead (dynamo cannot trace the C++ check).
        if not torch.compiler.is_compiling():
            self.arguments(channel_axis=1, call=0, validate=True)

    def arguments(self, channel_axis: int, call: int, validate: bool = False) -> tuple:
        """The policy arguments of dropit's operators (torch.ops.dropit.*) for forward call number
        ``call`` of a layer whose channels lie on ``channel_axis``: selection, granularity,
        channel_axis, gamma, chunk_size, seed, call, rescale. Seed and call travel as the signed
        64-bit integers with their bits; a selection that reads neither gets zeros, so that two
        layers caching one input under torch.compile make one call, which the compiler computes
        and keeps once (a residual block's first convolution and its shortcut)."""
        seed, call = _signed64(int(self.seed)), _signed64(int(call))
        if self.policy != "random":
            seed = call = 0
        arguments = (self.policy, self.granularity, int(channel_axis), float(self.gamma),
                     int(self.chunk_size), seed, call, bool(self.rescale))
        if validate:
            _C.PolicyArguments(*arguments)
        return arguments

    def plan(self, shape, dtype: torch.dtype, channel_axis: int, call: int = 0) -> dict:
        """The cache an input of ``shape`` and ``dtype`` gets in forward call ``call``: kept count,
        position_words, bytes, encoding and the packed layout (random selection's seed depends on
        the call; the sizes do not)."""
        return _C.plan([int(d) for d in shape], str(dtype).replace("torch.", ""),
                       _C.PolicyArguments(*self.arguments(channel_axis, call)))


def _signed64(value: int) -> int:
    """The signed 64-bit integer with the bits of ``value`` modulo 2**64."""
    value %= 2**64
    return value - 2**64 if value >= 2**63 else value
