"""All-reduce of small messages through PyTorch symmetric memory: what a decode step's 4-512 KiB
messages need, where NCCL's fixed cost (about 14 µs in a graph) exceeds the transfer many times.

Every rank copies its partial sum into a buffer that every peer can read over NVLink (P2P loads;
no multicast), then one kernel sums them: a one-shot for small messages (each rank reads all
peers), a two-shot for larger ones (reduce-scatter, then all-gather). Both are captured in the
decode graphs like any kernel. Two buffers alternate, so a rank that runs ahead never overwrites a
buffer a slower peer is still reading: a one-shot's barrier sits at its start, and within a forward
the next use of the same buffer is one all-reduce, hence one barrier, later. Across forwards (a
graph replayed twice, eager steps between replays) the choice fixed at capture can repeat a buffer
back to back; that stays safe because every forward ends with the logits' NCCL all-gather, which no
rank leaves before every rank has finished reading.

Setting up is collective (every rank, same order). It checks itself against NCCL once, and every
rank agrees on the outcome before any rank uses it; otherwise all stay on NCCL.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
import torch.distributed as dist

from fastpath.vocab import ALLREDUCE_ONE_SHOT_MAX_BYTES

log = logging.getLogger("fastpath.parallel")


class SymmAllReduce:
    def __init__(self, device: torch.device, dtype: torch.dtype, max_bytes: int) -> None:
        """Allocates the two buffers; `rendezvous` (collective) makes them visible to the peers."""
        import torch.distributed._symmetric_memory as symm_mem

        self.dtype, self.max_bytes = dtype, max_bytes
        numel = max_bytes // torch.empty((), dtype=dtype).element_size()
        self.buffers = [symm_mem.empty(numel, dtype=dtype, device=device) for _ in range(2)]
        self.group_name = ""
        ops = torch.ops.symm_mem
        self._one_shot_out = getattr(ops, "one_shot_all_reduce_out", None)
        self._calls = 0
        self.two_shot = True  # off after a two-shot refuses a shape (every rank refuses the same one)

    def rendezvous(self, group: Any) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before torch 2.9 or so; later a deprecated no-op
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                enable(group.group_name)
        for buf in self.buffers:
            symm_mem.rendezvous(buf, group)
        self.group_name = group.group_name

    def takes(self, x: torch.Tensor) -> bool:
        return (
            x.is_cuda
            and x.dtype == self.dtype
            and x.is_contiguous()
            and x.numel() * x.element_size() <= self.max_bytes
            and (self.two_shot or x.numel() * x.element_size() <= ALLREDUCE_ONE_SHOT_MAX_BYTES)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place."""
        flat = x.view(-1)
        buf = self.buffers[self._calls % 2][: flat.numel()]
        self._calls += 1
        buf.copy_(flat)
        ops = torch.ops.symm_mem
        if flat.numel() * flat.element_size() <= ALLREDUCE_ONE_SHOT_MAX_BYTES:
            if self._one_shot_out is not None:
                self._one_shot_out(buf, "sum", self.group_name, flat)
            else:
                flat.copy_(ops.one_shot_all_reduce(buf, "sum", self.group_name))
        else:
            ops.two_shot_all_reduce_(buf, "sum", self.group_name)
            flat.copy_(buf)
        return x


# Group names whose symmetric memory this process set up. torch keys that state by group name, and a
# later engine's group in this process can get the same name (names restart when the default group
# is destroyed), so only the first engine's group takes the fast path; later ones stay on NCCL.
_set_up: set[str] = set()


def setup(group: Any, rank: int, device: torch.device, dtype: torch.dtype, max_bytes: int):
    """(a checked SymmAllReduce that every rank agreed to use, "") or (None, why not). Collective:
    the ranks agree at each stage (may try, allocated, joined, checked) before any goes further,
    so a rank that fails alone takes the others to NCCL instead of leaving them in a collective."""
    if not _agree(group, device, group.group_name not in _set_up):
        return None, f"an earlier engine in this process used symmetric memory for group {group.group_name}"
    _set_up.add(group.group_name)
    fast = None
    stages = (
        ("allocate", lambda: SymmAllReduce(device, dtype, max_bytes)),
        ("rendezvous", lambda: fast.rendezvous(group)),
        ("check", lambda: _check(fast, group, rank, device)),
    )
    for stage, run in stages:
        why = ""
        try:
            result = run()
            if stage == "allocate":
                fast = result
            elif stage == "check":
                why = result
        except Exception as exc:  # no P2P, no symmetric memory in this torch, out of memory, ...
            why = f"symmetric memory failed to {stage} ({type(exc).__name__}: {exc})"
        if not _agree(group, device, not why):
            return None, why or f"another rank's symmetric memory failed to {stage}"
    return fast, ""


def _agree(group: Any, device: torch.device, mine: bool) -> bool:
    """True when every rank says True (an NCCL all-reduce of one flag)."""
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return flag.item() == 1


def _check(fast: SymmAllReduce, group: Any, rank: int, device: torch.device) -> str:
    """A message of each kind against NCCL; empty when they agree. Every rank runs every size, so
    all make the same collectives whatever any one finds."""
    gen = torch.Generator(device="cpu").manual_seed(1234 + rank)
    elem = torch.empty((), dtype=fast.dtype).element_size()
    sizes = [min(fast.max_bytes, ALLREDUCE_ONE_SHOT_MAX_BYTES) // elem // 4]
    if fast.max_bytes > ALLREDUCE_ONE_SHOT_MAX_BYTES:
        sizes.append(fast.max_bytes // elem)
    problems = []
    for numel in sizes:
        x = torch.randn(numel, generator=gen).to(device=device, dtype=fast.dtype)
        want = x.clone()
        dist.all_reduce(want, group=group)
        got = fast(x.clone())
        if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
            problems.append(f"the all-reduce of {numel} elements disagreed with NCCL")
    torch.cuda.synchronize(device)
    return "; ".join(problems)
