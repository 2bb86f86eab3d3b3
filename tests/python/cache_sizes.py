"""Cache sizes from the design's formulas, written independently of the library, for the tests to
compare the library's plans and the allocator's measurements against."""

import math

EPSILON = 2.220446049250313e-16


def kept_count(n: int, gamma: float) -> int:
    """n - floor(gamma n), a product within a few ulps of an integer counting as that integer;
    never 0 of a non-empty set."""
    if n <= 0:
        return 0
    product = gamma * n
    below = math.floor(product)
    dropped = below + 1 if (below + 1) - product <= 4 * EPSILON * product else below
    return max(n - dropped, 1)


def chunked_min_k_bytes(numel: int, gamma: float, chunk: int, element_bytes: int) -> int:
    """Values plus the smaller position encoding (a bitmask of 32-bit words per chunk, or a 16-bit
    offset per kept value; the bitmask on a tie)."""
    full, tail = divmod(numel, chunk)
    kept = full * kept_count(chunk, gamma) + kept_count(tail, gamma)
    bitmask = 4 * (full * math.ceil(chunk / 32) + math.ceil(tail / 32))
    return kept * element_bytes + min(bitmask, 2 * kept)


def relu_mask_bytes(numel: int) -> int:
    """One bit per element in 32-bit words."""
    return 4 * math.ceil(numel / 32)
