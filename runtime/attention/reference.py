"""The plain reference: explicit scores, fp32 softmax, no fused kernel. Always available."""

from __future__ import annotations

import torch

from .library import DenseFmhaLibrary


class ReferenceAttention(DenseFmhaLibrary):
    name = "reference"

    def dense(self, q, k, v, mask, causal, scale):
        groups = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if causal:
            lq, lk = scores.shape[-2:]
            rows = torch.arange(lk - lq, lk, device=q.device)[:, None]
            mask = torch.arange(lk, device=q.device)[None, :] <= rows
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(probs, v)
