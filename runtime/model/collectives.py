"""The model's collectives: what a forward needs from the other ranks of its tensor-parallel group.

`TPContext` is handed to the model. With one rank (`SINGLE`) every method returns its input and no
collective code runs. Each call is capturable in a CUDA graph on NCCL (no host syncs, fixed shapes):
decode graphs hold the all-reduces and the gather, and replay them on every rank in the same order,
because every rank replays the graphs rank 0's steps name. Caveats: the NCCL communicator must exist
before capture (the eager warmup steps create it), and a captured collective is invisible to NCCL's
watchdog, so a peer that dies mid-replay is noticed by rank 0's host (parallel/state.py), not by it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# torch renamed all_gather_into_tensor to all_gather_single; take whichever this torch has.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True, slots=True)
class TPContext:
    rank: int = 0
    world: int = 1
    group: Any = None  # the device process group: NCCL on CUDA, gloo on CPU

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' partial results in place: after a row-parallel layer and the embedding lookup."""
        if self.world == 1:
            return x
        dist.all_reduce(x, group=self.group)
        return x

    def gather_columns(self, x: torch.Tensor, total: int) -> torch.Tensor:
        """[T, C] per rank -> [T, total]: each rank's columns side by side, padding past `total` dropped."""
        if self.world == 1:
            return x
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty(self.world * rows, cols, dtype=x.dtype, device=x.device)
        _all_gather_single(out, x, group=self.group)
        return out.view(self.world, rows, cols).transpose(0, 1).reshape(rows, self.world * cols)[:, :total]


SINGLE = TPContext()
