"""What a dropit layer keeps: a small, picklable value validated by the C++ library."""

from dataclasses import dataclass

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
        self.spec(channel_axis=1, call=0)  # raises ValueError naming any bad field

    def spec(self, channel_axis: int, call: int):
        """The C++ policy of forward call number ``call`` for channels on ``channel_axis``."""
        return _C.make_spec(self.policy, self.granularity, float(self.gamma), int(self.chunk_size),
                            int(self.seed) % 2**64, bool(self.rescale), int(channel_axis),
                            int(call) % 2**64)
