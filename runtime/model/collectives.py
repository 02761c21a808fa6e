"""The model's collectives: what a forward needs from the other ranks of its tensor-parallel group.

`TPContext` is handed to the model. With one rank (`SINGLE`) every method returns its input and no
collective code runs. Each call is capturable in a CUDA graph on NCCL (no host syncs, fixed shapes):
decode graphs hold the all-reduces and the gather, and replay them on every rank in the same order,
because every rank replays the graphs rank 0's steps name. Caveats: the NCCL communicator must exist
before capture (the eager warmup steps create it), and a captured collective is invisible to NCCL's
watchdog, so a peer that dies mid-replay is noticed by rank 0's host (parallel/state.py), not by it.

On CUDA, small all-reduces take symmetric memory instead of NCCL (model/symm_allreduce.py), chosen
by message size when the graphs are traced, so a replay runs whichever was chosen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from fastpath.vocab import ALLREDUCE_ONE_SHOT_MAX_BYTES, allreduce_policy

log = logging.getLogger("fastpath.parallel")

# torch renamed all_gather_into_tensor to all_gather_single; take whichever this torch has.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(slots=True)
class TPContext:
    rank: int = 0
    world: int = 1
    group: Any = None  # the device process group: NCCL on CUDA, gloo on CPU
    fast: Any = None  # small messages' path (model/symm_allreduce.py), once setup_allreduce found one
    allreduce_path: str = "NCCL"  # in words, for the log and the bench

    def setup_allreduce(self, mode: str, device: torch.device, dtype: torch.dtype, max_bytes: int) -> str:
        """Choose how all-reduces travel (vocab.TP_ALLREDUCE); collective. The choice, in words."""
        if self.world == 1:
            return "none (one rank)"
        if mode == "nccl" or device.type != "cuda":
            self.allreduce_path = "NCCL" if device.type == "cuda" else "gloo (CPU)"
            return self.allreduce_path
        from .symm_allreduce import setup

        self.fast, why = setup(self.group, self.rank, device, dtype, max_bytes)
        self.allreduce_path = allreduce_policy(mode) if self.fast is not None else f"NCCL ({why})"
        return self.allreduce_path

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' partial results in place: after a row-parallel layer and the embedding lookup."""
        if self.world == 1:
            return x
        fast = self.fast
        if fast is not None and fast.takes(x):
            try:
                return fast(x)
            except RuntimeError as exc:
                # A shape the two-shot refuses is refused on every rank alike (shapes are the same
                # everywhere); memory and device errors are one rank's, and must not split the ranks.
                one_shot = x.numel() * x.element_size() <= ALLREDUCE_ONE_SHOT_MAX_BYTES
                if (
                    one_shot
                    or isinstance(exc, torch.OutOfMemoryError)
                    or type(exc).__name__ == "AcceleratorError"
                ):
                    raise
                fast.two_shot = False
                log.warning(
                    "two-shot all-reduce refused %s (%s): NCCL takes those messages", tuple(x.shape), exc
                )
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
