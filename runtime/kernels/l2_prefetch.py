"""A weight asked of L2 from a side branch of a captured decode graph, ahead of the kernel that reads it.

After a layer's q|k|v projection, decode attention reads a few KB of KV cache a row at short contexts
and HBM sits idle for ~5 µs. A kernel on a side stream, forked from the capture after q|k|v, asks L2
for o_proj's weight (8.4 MB on the 1.24B Llama) in that window. It writes nothing and nothing waits on
it: the branch joins the capture's stream only where the capture ends, so no kernel on the step's path
gains an edge (round 20 issued the same prefetches from a kernel on the path and every batch slowed).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Weights asked of L2, by the name the model gives them (bench/ab_step.py sets it).
WEIGHTS: frozenset[str] = frozenset({"o_proj"})
MAX_ROWS = 64  # decode-sized steps only: a prefill's linears are bound by compute, not by the weight read
CHUNK = 4096  # bytes a bulk prefetch asks for (the literal in the kernel's asm)
BLOCK = 128


@triton.jit
def l2_prefetch_kernel(ptr, n_chunks, BLOCK: tl.constexpr):
    """One bulk prefetch of 4096 bytes a lane (the TMA unit fetches it into L2, no register holds it);
    lanes past the last whole chunk repeat it, and the tail under 4096 bytes is left out."""
    i = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n_chunks - 1)
    p = ptr.to(tl.pointer_type(tl.int8), bitcast=True) + i.to(tl.int64) * 4096
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], 4096;\n\tmov.u32 $0, 0;",
        "=r,l",
        [p],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


class L2Prefetch:
    """Side streams of the graphs being captured: `ask` forks one from the capture and launches the
    prefetch on it; `join` (where the capture ends) merges it back, as a captured fork must be."""

    __slots__ = ("_open", "_streams")

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}  # by device index
        self._open: set[int] = set()

    def ask(self, name: str, weight: torch.Tensor, rows: int) -> None:
        if name not in WEIGHTS or rows > MAX_ROWS or weight.device.type != "cuda":
            return
        if not torch.cuda.is_current_stream_capturing():
            return  # eager steps keep one stream: a fork there is a host round of event calls a step
        n_chunks = weight.numel() * weight.element_size() // CHUNK
        if n_chunks == 0 or not weight.is_contiguous():
            return
        index = weight.device.index
        side = self._streams.get(index)
        if side is None:
            side = self._streams[index] = torch.cuda.Stream(index)
        side.wait_stream(torch.cuda.current_stream(index))
        with torch.cuda.stream(side):
            l2_prefetch_kernel[(triton.cdiv(n_chunks, BLOCK),)](weight, n_chunks, BLOCK=BLOCK, num_warps=4)
        self._open.add(index)

    def join(self) -> None:
        """Merge every open branch into its device's current stream (the capture's, where it ends)."""
        for index in sorted(self._open):
            torch.cuda.current_stream(index).wait_stream(self._streams[index])
        self._open.clear()
