"""Views of vLLM's KV-cache tensors that kvtier's copiers take."""

from __future__ import annotations

import torch


def block_rows(tensor: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """The tensor as int8 rows of one block each (its stride kept when it
    already is such rows)."""
    if tensor.dim() == 2 and tensor.dtype == torch.int8:
        return tensor
    return tensor.view(torch.int8).view(-1, page_bytes)
