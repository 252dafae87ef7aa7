"""What the fast path and the fallback share: the two-row yes/no head and the scoring module's
interface.

score = logit("yes") - logit("no") at each candidate's last real position
(docs/architecture.md, section 2). Only the "yes" and "no" rows of ``lm_head`` are read; the
vocabulary-wide head is never computed.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch
from torch import nn

logger = logging.getLogger(__name__)


def yes_no_logodds(hidden: torch.Tensor, head: nn.Linear, yes_no_ids: torch.Tensor) -> torch.Tensor:
    """``[N]`` float32 log-odds from final hidden states ``[N, hidden]`` (after the final norm)
    projected onto the ``[yes, no]`` rows of ``head``."""
    logits = hidden.float() @ head.weight[yes_no_ids].float().T
    if head.bias is not None:
        logits = logits + head.bias[yes_no_ids].float()
    return logits[:, 0] - logits[:, 1]


class YesNoModule(nn.Module):
    """A ``*ForCausalLM`` model (``.lm``) as a scoring module over shared prefixes.

    Subclasses implement :meth:`encode_prefixes` (run right-padded prefixes ``[G, P]`` once and
    keep what candidates need of them) and :meth:`score_documents` (scores ``[N]`` of
    right-padded candidates ``[N, D]``, document + suffix tokens, where ``doc_group[i]`` is the
    prefix row candidate ``i`` continues, or None when one prefix is broadcast to all).
    :meth:`forward` is the differentiable training entry point; it is the same for every
    subclass, so DDP/FSDP get gradients through exactly the code that serves.
    """

    path: ClassVar[str]
    """``"fast"`` or ``"fallback"``: which of the two causal paths this is."""

    def __init__(self, causal_lm: nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__()
        self.lm = causal_lm
        self.register_buffer("yes_no_ids", torch.tensor([yes_id, no_id]), persistent=False)

    def encode_prefixes(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor) -> Any:
        raise NotImplementedError

    def score_documents(
        self,
        prefix: Any,
        doc_ids: torch.Tensor,
        doc_lengths: torch.Tensor,
        doc_group: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    def compile_layers(self, **options: Any) -> None:
        """``torch.compile`` the decoder layers where the path supports it (the fast one)."""
        logger.warning("compile=True is ignored on the %s causal path", self.path)

    def forward(
        self,
        prefix_ids: torch.Tensor,
        prefix_mask: torch.Tensor,
        doc_ids: torch.Tensor,
        doc_lengths: torch.Tensor,
        doc_group: torch.Tensor,
    ) -> torch.Tensor:
        """Differentiable scores for training: several groups, each with its own prefix."""
        state = self.encode_prefixes(prefix_ids, prefix_mask)
        return self.score_documents(state, doc_ids, doc_lengths, doc_group)
