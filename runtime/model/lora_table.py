"""LoRA adapters on the device: `max_loras` slots, every one applied in the same matmuls.

For each fused projection p of each layer, the slots' A matrices sit side by side in one
[in, slots * W] tensor and their B matrices stacked in one [slots * W, out] tensor, W being the
slot's width: max_lora_rank per HF module the projection fuses (q|k|v: 3, gate|up: 2). A token's
delta is

    (x @ A_all, the other slots' columns zeroed) @ B_all

zeroing by a select, so that another slot's overflow never reaches a row (inf times a mask's 0 is
NaN), and the add onto the projection's output rides in the expand's epilogue: on CUDA two Triton
launches a projection (kernels/lora_kernels.py), elsewhere three torch ops (TorchOps.lora_add). A
token with no adapter (slot -1) keeps none, so its delta is exactly zero and its output the base
model's bits. Every row's delta depends on its
own slot only, and the step's shapes never depend on which adapters run: one CUDA graph serves any
mix of them. The price is the other slots' columns in the shrink (slots * W of them, a few hundred
at most), small beside the projection's own matmul.

Under tensor parallelism a rank holds its slice: the B rows of its heads or MLP width for the
column-parallel projections (q|k|v, gate|up), the A columns of its inputs for the row-parallel ones
(o, down), whose partial deltas the layer's all-reduce sums with the rest of its output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import ModelConfig
from .lora_adapter import MODULES, PARTS, PROJECTIONS
from .sharding import Partition, Span, local_config


@dataclass(slots=True)
class LoRAPass:
    """One forward's view of the table: its tokens' slots, and the ops that add the deltas."""

    table: LoRATable
    slots: torch.Tensor
    ops: Any

    def add(self, layer: int, proj: str, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """`out` plus the delta of inputs `x` (ops.lora_add: two Triton launches on CUDA, the add in the
        expand). A row with no adapter expands zeros, so it keeps `out`'s bits."""
        t = self.table
        return self.ops.lora_add(x, out, t.a[proj][layer], t.b[proj][layer], self.slots, t.widths[proj])


class LoRATable:
    def __init__(
        self,
        cfg: ModelConfig,
        part: Partition,
        slots: int,
        rank: int,
        max_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.slots, self.rank, self.dtype = slots, rank, dtype
        local = local_config(cfg, part)
        h, d = cfg.hidden_size, cfg.head_dim
        q_l, kv_l, inter_l = local.q_size, local.kv_size, local.intermediate_size
        dims = {"qkv": (h, q_l + 2 * kv_l), "o": (q_l, h), "gate_up": (h, 2 * inter_l), "down": (inter_l, h)}
        self.widths = {p: rank * len(PARTS[p]) for p in PROJECTIONS}
        L = cfg.num_layers
        self.a = {
            p: torch.zeros(L, i, slots * self.widths[p], dtype=dtype, device=device)
            for p, (i, _) in dims.items()
        }
        self.b = {
            p: torch.zeros(L, slots * self.widths[p], o, dtype=dtype, device=device)
            for p, (_, o) in dims.items()
        }
        # Where each HF module's output rows start in its projection's local output.
        self.out_offset = {"q_proj": 0, "k_proj": q_l, "v_proj": q_l + kv_l, "o_proj": 0,
                           "gate_proj": 0, "up_proj": inter_l, "down_proj": 0}  # fmt: skip
        q = Span(part.q_heads.start * d, part.q_heads.size * d)
        kv = Span(part.kv_heads.start * d, part.kv_heads.size * d)
        mlp = part.intermediate
        # The slice a rank keeps: of B's rows (column-parallel) or of A's columns (row-parallel).
        self.b_rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "gate_proj": mlp, "up_proj": mlp}
        self.a_columns = {"o_proj": q, "down_proj": mlp}
        self.token_slots = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        # Whether the forward runs the deltas: off for a step where no token has an adapter, which
        # then runs the base model's fused path (and, in graphs, the base graphs).
        self.active = False

    def clear(self, slot: int) -> None:
        for p in PROJECTIONS:
            w = self.widths[p]
            self.a[p][:, :, slot * w : (slot + 1) * w].zero_()
            self.b[p][:, slot * w : (slot + 1) * w].zero_()

    @torch.no_grad()
    def load(self, slot: int, weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]) -> None:
        """An adapter's (layer, HF module) -> (A [r, in], scaled B [out, r]) into `slot`, this rank's
        slice of each; the modules it does not target add nothing. In stream order: a step in flight
        that used the slot before has read it."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"LoRA slot {slot} is outside [0, {self.slots})")
        self.clear(slot)
        for (layer, module), (a, b) in weights.items():
            p = MODULES[module]
            r = a.shape[0]
            col = slot * self.widths[p] + PARTS[p].index(module) * self.rank
            if module in self.a_columns:
                s = self.a_columns[module]
                a = a[:, s.start : s.stop]
            if module in self.b_rows:
                s = self.b_rows[module]
                b = b[s.start : s.stop]
            dev = self.a[p].device
            self.a[p][layer, :, col : col + r].copy_(a.t().to(dev, self.dtype))
            out = self.out_offset[module]
            self.b[p][layer, col : col + r, out : out + b.shape[0]].copy_(b.t().to(dev, self.dtype))

    def place(self, slots: torch.Tensor | None, n: int) -> None:
        """A step's token slots (host int64 [n], -1: no adapter); None: no token has one."""
        self.active = slots is not None  # inactive, the forward never reads token_slots
        if slots is None:
            return
        if slots.shape[0] != n:
            raise ValueError(f"a step of {n} tokens came with {slots.shape[0]} LoRA slots")
        if self.token_slots.is_cuda and not slots.is_pinned():
            slots = slots.pin_memory()
        self.token_slots[:n].copy_(slots, non_blocking=True)

    def begin(self, n: int, ops) -> LoRAPass:
        """The pass over a forward of `n` tokens, which read slots [0, n) of `token_slots`."""
        return LoRAPass(self, self.token_slots[:n], ops)
