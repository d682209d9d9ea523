"""How a passage's residual codes are laid out (`build_index.refine_residual`): which product
quantizers code which dimensions, and how many bytes that makes a passage.

The residual r = x - x1 (what a compressed index's own code x1 misses of a passage x;
fid.retrieval.residual_codes) is coded by stages, each a product quantizer of M sub-quantizers
of `bits` over dimensions [lo, hi):
  * product-quantizer stages ("PQ128", "PQ128x10", "PQ64+PQ64"): each stage over all
    dimensions;
  * a byte budget (an int, e.g. 144): disjoint stages over the axes of the rotated residual
    (fid.retrieval.residual_training), the bits spread by reverse water-filling (`allocate`):
    an axis of variance v gets ~0.5 log2(v / theta) bits, theta set so that the codes fit the
    budget, each group of GROUP axes rounded to the nearest rate a product quantizer offers
    (RATES: 1 dim a sub-quantizer at 6-8 bits, 2 at 6-10, 4, 8 or 16 at 8). The last
    SCALE_BYTES of each passage's codes are its scale (a float16 beta).

Kept apart from the codes' training and search because the disk plan (`code_bytes`: rules,
`fid` commands) sizes an index from it without building one.
"""

from __future__ import annotations

import math

import numpy as np

from fid.config import ConfigError
from fid.config.retrieval import parse_refine_stages

# A budget's scale beta: the last bytes of each passage's codes, one float16
SCALE_BYTES = 2

# A byte budget's rates: (dimensions a sub-quantizer, bits a code), i.e. bits a dimension
# 8, 7, 6, 5, 4, 3, 2, 1, 0.5; a group of GROUP consecutive axes shares one.
RATES = ((1, 8), (1, 7), (1, 6), (2, 10), (2, 8), (2, 6), (4, 8), (8, 8), (16, 8))
GROUP = 16

# A stage of the layout: a product quantizer of M sub-quantizers of `bits` over dimensions
# [lo, hi) of the (rotated) residual.
Layout = list[tuple[int, int, int, int]]  # (lo, hi, M, bits) each


def code_bytes(spec: str | int, dim: int) -> int:
    """Bytes of residual codes a passage, at most: the stages', or a budget's, which the
    finest rate caps (8 bits a dimension and the scale: a larger budget codes no finer)."""
    if isinstance(spec, int):
        finest = max(bits / dsub for dsub, bits in RATES)
        return min(spec, math.ceil(dim * finest / 8) + SCALE_BYTES)
    return sum(stage_bytes(m, bits) for m, bits in parse_refine_stages(spec))


def stage_bytes(m: int, bits: int) -> int:
    """A product quantizer's code size: M codes of `bits`, packed (faiss's code_size)."""
    return (m * bits + 7) // 8


def allocate(variances: np.ndarray, budget: int, max_bits: int = 16, spare: int = 0) -> Layout:
    """Reverse water-filling of `budget` - `spare` bytes over axes of these variances (largest
    first): the layout of disjoint stages, consecutive groups of the same rate merged; codes of
    at most `max_bits` (k-means needs a training vector per centroid).

    Raises:
        ConfigError: for a budget below the smallest rate's (0.5 bit a dimension) + `spare`.
    """
    dim = len(variances)
    group = math.gcd(dim, GROUP)
    rates = [(dsub, bits) for dsub, bits in RATES if group % dsub == 0 and bits <= max_bits]
    strength = np.maximum(variances.reshape(-1, group).mean(axis=1), 1e-30)  # (groups,)

    def pick(theta: float) -> list[tuple[int, int]]:
        wanted = 0.5 * np.log2(strength / theta)  # bits a dimension, per group
        return [min(rates, key=lambda r: abs(r[1] / r[0] - w)) for w in wanted]

    def layout(chosen) -> Layout:
        stages, start = [], 0
        for g in range(1, len(chosen) + 1):
            if g == len(chosen) or chosen[g] != chosen[start]:
                dsub, bits = chosen[start]
                lo, hi = start * group, g * group
                stages.append((lo, hi, (hi - lo) // dsub, bits))
                start = g
        return stages

    def cost(stages: Layout) -> int:
        return sum(stage_bytes(m, bits) for _, _, m, bits in stages)

    coarsest = layout([min(rates, key=lambda r: r[1] / r[0])] * len(strength))
    if cost(coarsest) + spare > budget:
        least = cost(coarsest) + spare
        raise ConfigError(
            f"refine_residual = {budget} bytes is below the coarsest coding of d={dim} "
            f"({least} bytes: 0.5 bit a dimension"
            + (f" and {spare} for the scale" if spare else "")
            + f"). Hint: at least {least}"
        )
    budget -= spare
    # log theta between "every group at the finest rate" and "every group at the coarsest"
    low, high = np.log2(strength.min()) - 20, np.log2(strength.max()) + 2
    for _ in range(60):
        middle = (low + high) / 2
        if cost(layout(pick(2.0**middle))) > budget:
            low = middle
        else:
            high = middle
    return layout(pick(2.0**high))


__all__ = ["GROUP", "RATES", "SCALE_BYTES", "Layout", "allocate", "code_bytes", "stage_bytes"]
