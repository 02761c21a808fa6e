"""Rank 0 -> workers: each step's host inputs, broadcast over a gloo group.

A message is a fixed header of int64 values, then its payload tensors, whose sizes the header gives.
Workers receive a decode step's packed inputs into pinned buffers used in alternation, as rank 0
stages them, so a buffer is not refilled while the copy out of it may still be pending.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..model.lora_adapter import MODULES
from ..runner.penalties import WORD_TOKENS, PenaltyFill
from ..runner.sampler import FIELDS, SamplingTensors
from ..runner.step_inputs import DecodeStep, PrefillStep

HEADER = 14
MODULE_NAMES = tuple(MODULES)  # an adapter's HF module, by its index in Op.LOAD_ADAPTER's header
log = logging.getLogger("fastpath.parallel")


class Op(enum.IntEnum):
    DECODE = 1
    PREFILL = 2
    PREFILL_LOGITS = 3  # a prefill whose logits rank 0 wants (prompt_logits): nothing is sampled
    WARMUP_DONE = 4
    STOP = 5
    LOAD_ADAPTER = 6  # a LoRA adapter's weights, into a slot before the next step
    PREFILL_HIDDEN = 7  # a prefill whose final hidden states rank 0 pools (embed, encode)


Message = tuple[Op, DecodeStep | PrefillStep | tuple[int, dict] | None]


class Channel:
    def __init__(self, group: Any, rank: int, pin_memory: bool, send_timeout_s: float = 300.0) -> None:
        """`send_timeout_s` bounds rank 0's sends: a worker that does not take a step within it (a
        stopped process) fails the send, though workers may wait for rank 0 as long as it is idle."""
        self.group = group
        self.rank = rank
        self.pin_memory = pin_memory
        self.send_timeout = timedelta(seconds=send_timeout_s)
        self._header = torch.zeros(HEADER, dtype=torch.int64)
        self._flip = 0
        self._buffers: dict[tuple[int, int, int], torch.Tensor] = {}
        self.abandoned: list[Any] = []  # sends given up on, still held by the backend's thread

    def _bcast(self, t: torch.Tensor) -> None:
        if self.rank != 0:
            dist.broadcast(t, src=0, group=self.group)
            return
        work = dist.broadcast(t, src=0, group=self.group, async_op=True)
        try:
            done = work.wait(timeout=self.send_timeout)
        except RuntimeError:
            if work.is_completed():
                raise  # it failed: a worker is gone, and the error says how
            done = False  # timed out
        if not done:
            self.abandoned.append(work)
            raise RuntimeError(
                f"a worker did not take rank 0's step within {self.send_timeout.total_seconds():g} s"
            )

    def settle(self, timeout_s: float) -> None:
        """Let abandoned sends end (their peer is gone), so no backend thread still runs one when the
        group is destroyed or the process exits."""
        for work in self.abandoned:
            with contextlib.suppress(RuntimeError):  # failing is what a send to an ended worker does
                work.wait(timeout=timedelta(seconds=timeout_s))
            if not work.is_completed():
                log.warning("a step send to an ended worker did not end within %g s", timeout_s)
        self.abandoned.clear()

    # --- rank 0 -----------------------------------------------------------------------------------

    def send(self, op: Op, step: DecodeStep | PrefillStep | None = None) -> None:
        fields: list[int] = []
        payload: list[torch.Tensor] = []
        if isinstance(step, DecodeStep):
            rows, cols = step.packed.shape
            fields = [
                step.num_seqs, rows, cols, step.sampling is not None, step.uses_prev, step.top_logprobs, step.words,
                step.lora is not None,
            ]  # fmt: skip
            payload.append(step.packed)
            if step.lora is not None:
                payload.append(step.lora)
        elif isinstance(step, PrefillStep):
            (t,), (s, w), (r,) = step.ids.shape, step.tables.shape, step.logits_rows.shape
            fill = step.penalty
            # (sequences, tokens, stop-id width, bias width + 1, word rows) of the penalty work; 0
            # sequences: none, bias width 0: no biases, 0 word rows: no words.
            shape = [0, 0, 0, 0, 0]
            if fill is not None:
                biases = 0 if fill.bias_ids is None else fill.bias_ids.shape[1] + 1
                words = 0 if fill.words is None else fill.words.shape[1]
                shape = [len(fill.slots), len(fill.tokens), fill.stop_ids.shape[1], biases, words]
            fields = [t, s, w, r, step.sampling is not None, step.top_logprobs, step.words, *shape]
            fields.append(step.lora is not None)
            parts = (
                step.ids,
                step.positions,
                step.slots,
                step.tables,
                step.ends,
                step.query_lens,
                step.logits_rows,
            )
            payload.append(torch.cat([f.flatten() for f in parts]))
            if fill is not None:
                payload.append(torch.cat([f.flatten() for f in fill.tensors()]))
            if step.lora is not None:
                payload.append(step.lora)
        if step is not None and step.sampling is not None:
            payload.append(step.sampling.data)
        header = [int(op), *map(int, fields)]
        self._bcast(torch.tensor(header + [0] * (HEADER - len(header)), dtype=torch.int64))
        for t in payload:
            self._bcast(t)

    def send_adapter(self, slot: int, weights: dict) -> None:
        """Op.LOAD_ADAPTER: a LoRA adapter's weights for `slot`, whole (each rank takes its slice):
        a header of (layer, module, rank, out, in) per pair, then the pairs in float32."""
        pairs = sorted(weights.items())
        index = torch.tensor(
            [
                [layer, MODULE_NAMES.index(m), a.shape[0], b.shape[0], a.shape[1]]
                for (layer, m), (a, b) in pairs
            ],
            dtype=torch.int64,
        )
        header = [int(Op.LOAD_ADAPTER), slot, len(pairs)]
        self._bcast(torch.tensor(header + [0] * (HEADER - len(header)), dtype=torch.int64))
        self._bcast(index)
        self._bcast(torch.cat([t.float().flatten() for _, (a, b) in pairs for t in (a, b)]))

    def send_bounded(self, op: Op, timeout_s: float) -> bool:
        """A message without payload that gives up after `timeout_s`: False when a worker did not take it
        (a stopped worker never does, and the control group's own timeout is days)."""
        header = torch.tensor([int(op)] + [0] * (HEADER - 1), dtype=torch.int64)
        try:
            work = dist.broadcast(header, src=0, group=self.group, async_op=True)
        except RuntimeError:
            return False
        try:
            if work.wait(timeout=timedelta(seconds=timeout_s)):
                return True
        except RuntimeError:
            if work.is_completed():
                return False
        self.abandoned.append(work)
        return False

    # --- workers ----------------------------------------------------------------------------------

    def recv(self) -> Message:
        self._bcast(self._header)
        op, a, b, c, d, e, f, g, h, i, j, k, m, n = (int(v) for v in self._header[:HEADER])
        op = Op(op)
        if op is Op.DECODE:
            num_seqs, rows, cols, has_sampling, uses_prev, top, words, has_lora = a, b, c, d, e, f, g, h
            packed = self._pinned(rows, cols)
            self._bcast(packed)
            lora = self._ints(rows) if has_lora else None
            sampling = self._sampling(rows) if has_sampling else None
            step = DecodeStep(
                num_seqs,
                packed,
                sampling,
                bool(uses_prev),
                top_logprobs=bool(top),
                words=bool(words),
                lora=lora,
            )
            return op, step
        if op is Op.LOAD_ADAPTER:
            index = torch.empty(b, 5, dtype=torch.int64)
            self._bcast(index)
            shapes = [((r, i), (o, r)) for _, _, r, o, i in index.tolist()]
            sizes = [a[0] * a[1] for pair in shapes for a in pair]
            flat = torch.empty(sum(sizes), dtype=torch.float32)
            self._bcast(flat)
            parts = iter(flat.split(sizes))
            weights = {
                (layer, MODULE_NAMES[m]): (next(parts).view(ra), next(parts).view(rb))
                for (layer, m, *_), (ra, rb) in zip(index.tolist(), shapes, strict=True)
            }
            return op, (a, weights)
        if op in (Op.PREFILL, Op.PREFILL_LOGITS, Op.PREFILL_HIDDEN):
            t, s, w, r, has_sampling, top, words = a, b, c, d, e, f, g
            flat = torch.empty(3 * t + s * w + 2 * s + r, dtype=torch.int64)
            self._bcast(flat)
            ids, positions, slots, tables, ends, query_lens, logits_rows = flat.split(
                [t, t, t, s * w, s, s, r]
            )
            fill = self._penalty_fill(h, i, j, k, m) if h else None
            lora = self._ints(t) if n else None
            step = PrefillStep(
                ids, positions, slots, tables.view(s, w), ends, query_lens, logits_rows,
                self._sampling(r) if has_sampling else None, bool(top), fill, bool(words), lora=lora,
            )  # fmt: skip
            return op, step
        return op, None

    def _ints(self, n: int) -> torch.Tensor:
        data = torch.empty(n, dtype=torch.int64)
        self._bcast(data)
        return data

    def _sampling(self, rows: int) -> SamplingTensors:
        data = torch.empty(rows, len(FIELDS), dtype=torch.int64)
        self._bcast(data)
        return SamplingTensors(data)

    def _penalty_fill(self, seqs: int, tokens: int, width: int, biases: int, words: int) -> PenaltyFill:
        k = max(biases - 1, 0)  # the bias width; `biases` 0: none
        sizes = [seqs, seqs, seqs, tokens, seqs * width] + ([seqs, seqs * k, seqs * k] if biases else [])
        sizes += [seqs * words * WORD_TOKENS] if words else []
        flat = torch.empty(sum(sizes), dtype=torch.int64)
        self._bcast(flat)
        parts = flat.split(sizes)
        fill = PenaltyFill(*parts[:4], parts[4].view(seqs, width))
        if biases:
            fill.exclusive, fill.bias_ids, fill.bias_bits = (
                parts[5],
                parts[6].view(seqs, k),
                parts[7].view(seqs, k),
            )
        if words:
            fill.words = parts[8].view(seqs, words, WORD_TOKENS)
        return fill

    def _pinned(self, rows: int, cols: int) -> torch.Tensor:
        self._flip ^= 1
        key = (rows, cols, self._flip)
        buf = self._buffers.get(key)
        if buf is None:
            buf = torch.zeros(rows, cols, dtype=torch.int64, pin_memory=self.pin_memory)
            self._buffers[key] = buf
        return buf
