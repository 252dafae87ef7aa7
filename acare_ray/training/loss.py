"""Localized contrastive estimation (LCE) loss: a softmax over each group of candidates.

A training group is one positive document followed by its negatives, all scored against the
same prompt (docs/architecture.md, section 5.3). Scores are the raw log-odds of the scoring contract
(``logit("yes") - logit("no")``); the temperature lives here and nowhere else.

``loss = mean over groups of -log softmax(scores[g] / T)[0]``

computed in float32 even when the model runs in bf16, so the softmax of a group of eight does not
lose the small differences that carry the gradient.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

DEFAULT_GROUP_SIZE = 8
DEFAULT_TEMPERATURE = 0.5


def _check_temperature(temperature: float) -> None:
    if not (
        isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0
    ):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def lce_loss(
    scores: torch.Tensor,
    group_size: int = DEFAULT_GROUP_SIZE,
    temperature: float = DEFAULT_TEMPERATURE,
) -> torch.Tensor:
    """LCE loss over groups of scores whose positive sits at index 0.

    Args:
        scores: raw log-odds, either flat ``[groups * group_size]`` (groups laid out one after
            another, positive first in each) or ``[groups, group_size]``. Any floating dtype;
            bf16/fp16 are upcast to float32 before the softmax.
        group_size: documents per group (1 positive + ``group_size - 1`` negatives), >= 2.
        temperature: the scores are divided by it before the softmax, > 0.

    Returns:
        A float32 scalar: the cross-entropy with target 0, averaged over groups.

    Raises:
        TypeError: ``scores`` is not a floating-point tensor.
        ValueError: bad ``group_size``/``temperature``, or a shape that does not split into groups.
    """
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2 (1 positive + negatives), got {group_size!r}"
        )
    _check_temperature(temperature)
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise TypeError(f"scores must be a floating-point tensor, got dtype {scores.dtype}")
    if scores.dim() == 1:
        if scores.numel() == 0 or scores.numel() % group_size:
            raise ValueError(
                f"scores has {scores.numel()} elements, not a positive multiple of "
                f"group_size={group_size}"
            )
        grouped = scores.view(-1, group_size)
    elif scores.dim() == 2:
        if scores.shape[0] == 0 or scores.shape[1] != group_size:
            raise ValueError(
                f"scores has shape {tuple(scores.shape)}, expected [groups >= 1, "
                f"group_size={group_size}]"
            )
        grouped = scores
    else:
        raise ValueError(
            f"scores must be 1-D or 2-D [groups, group_size], got shape {tuple(scores.shape)}"
        )
    logits = grouped.to(torch.float32) / temperature
    target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
    return F.cross_entropy(logits, target)
