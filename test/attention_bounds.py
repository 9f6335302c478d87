"""Per-element error bounds of attention kernels against a float64 reference.

An output element's rounding error is a few units of the dtype's precision times what the
rounding of its terms can move it: ``|reference| + spread``, where ``spread`` is the
attention-weighted mean of ``|v|`` for that element (the probabilities and the values are each
rounded once per term). Measured on the prefill kernel over random batches: at most 0.84 x 2^-8
of that in bfloat16 and 8.2e-7 in float32. The bounds leave 2.4x and 12x of room; a key left
out of one long request's softmax (a one-key masking error) exceeds them (22 of 22 batches).
"""

from __future__ import annotations

import torch

RELATIVE = {torch.bfloat16: 2**-7, torch.float32: 1e-5}
ABSOLUTE = {torch.bfloat16: 1e-6, torch.float32: 1e-7}


SCORE_ROUNDING = 2**-22  # float32 scores of magnitude s are off by a few units of s x 2^-24


def excess(
    out: torch.Tensor, want: torch.Tensor, spread: torch.Tensor, dtype, max_score: float = 0.0
) -> float:
    """The largest error of ``out`` in units of its element's bound (within it when <= 1);
    0 for empty outputs. ``max_score``: the largest |score| where scores are far from 0 (every
    probability then moves by the scores' own float32 rounding)."""
    if out.numel() == 0:
        return 0.0
    relative = RELATIVE[dtype] + SCORE_ROUNDING * max_score
    bound = relative * (want.abs() + spread) + ABSOLUTE[dtype]
    return float(((out.double() - want).abs() / bound).max())
