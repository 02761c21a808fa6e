"""From a scheduled batch to a step payload, and a launched step's results.

The scheduler's batch becomes a `DecodeStep` or `PrefillStep` (runner/step_inputs.py) on the host.
Rank 0 alone tracks the launched step (`InflightStep`) and what completing it did (`StepRecord`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..runner.decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, POSITION, SLOT, SRC_ROW, TOKEN
from ..runner.penalties import ANY, WORD_TOKENS, PenaltyFill, PenaltySlots
from ..runner.sampler import FIELDS, Sampled, SamplingTensors, float_bits
from ..runner.step_inputs import DecodeStep, PrefillStep
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch
from .sequence import Sequence

if TYPE_CHECKING:
    from .sampling_rows import SamplingRows

# stage() writes a row's fixed columns as one tuple in this order.
assert tuple(range(FIXED_COLUMNS)) == (TOKEN, SRC_ROW, POSITION, SLOT, CONTEXT_LEN)


@dataclass(slots=True)
class InflightStep:
    """A launched step whose sampled tokens are still on their way to the host."""

    batch: ScheduledBatch
    sampled: list[Sequence]  # in row order of `tokens`
    tokens: torch.Tensor  # device
    rows: dict[int, int]  # seq_id -> row in `tokens`, for the next step's inputs
    host: Sampled  # the same rows in pinned host memory, valid once the read-back completes
    ticket: int  # read-back sequence number (readback.py)
    event: torch.cuda.Event | None = None  # under tensor parallelism, or with read-back by event
    top_k: int = 0  # the top-k logprob columns of `host` that some row asked for
    # The step launched after it holds the same batch (Scheduler.continue_decode's fast path): no row
    # reached a length limit with this step's token (ExecutorCore._accept_steady).
    continues: bool = False


@dataclass(slots=True)
class StepRecord:
    phase: str
    num_tokens: int = 0  # tokens the step computed (a decode step: one per sequence)
    finished: list[Sequence] = field(default_factory=list)
    new_tokens: list[tuple[Sequence, int]] = field(default_factory=list)
    # How long the host waited for the step's tokens; the rest of the step was host work.
    device_wait_s: float = 0.0


def _general_for_any_row(p: SamplingParams) -> bool:
    """Whether every row of these parameters needs the general sampler, whatever it has generated.
    A guided row's greedy token need not rank first among the raw logits: the general sampler
    counts its rank."""
    if p.logprobs is not None and (p.logprobs > 0 or p.guided is not None):
        return True
    return not p.greedy or p.penalized or p.biased


def needs_general(seq: Sequence) -> bool:
    """Whether the sequence's next token needs the general sampler rather than the greedy one."""
    return _general_for_any_row(seq.params) or seq.num_generated < seq.params.min_tokens


def any_needs_general(seqs: list[Sequence]) -> bool:
    """needs_general of any sequence, deciding once per SamplingParams: a step's rows share few."""
    always: dict[int, bool] = {}
    for seq in seqs:
        p = seq.params
        hit = always.get(id(p))
        if hit is None:
            hit = always[id(p)] = _general_for_any_row(p)
        if hit or (p.min_tokens and len(seq.output_ids) + seq.num_pending < p.min_tokens):
            return True
    return False


def keeps_penalty_state(seq: Sequence) -> bool:
    """Whether the sequence needs a penalty-table slot (runner/penalties.py)."""
    return seq.params.penalized or seq.params.min_tokens > 0 or seq.biases is not None


def bans_words(seq: Sequence) -> bool:
    """Whether the sequence has bad words of several tokens: its steps ban tokens on the device."""
    return seq.biases is not None and bool(seq.biases.sequences)


def wants_top_logprobs(seqs: list[Sequence]) -> bool:
    return most_top_logprobs(seqs) > 0


def most_top_logprobs(seqs: list[Sequence]) -> int:
    """The most top-k logprobs any row asks for, deciding once per SamplingParams."""
    return max((p.logprobs or 0 for p in {id(s.params): s.params for s in seqs}.values()), default=0)


def _int64(v: int) -> int:
    # Seeds are 64-bit: a derived seed past 2**63 - 1 wraps instead of overflowing the tensor.
    return (v + (1 << 63)) % (1 << 64) - (1 << 63)


def sampling_tensors(seqs: list[Sequence], rows: int, slots: PenaltySlots | None = None) -> SamplingTensors:
    """The sampling parameters of `seqs`, padded to `rows` with greedy rows, on the host."""
    flat: list[int] = []
    for s in seqs:
        slot = slots.slot_of(s) if slots is not None else 0
        row = s.sampling_row
        if row is None or row[_SLOT] != slot:  # only the slot changes (preemption frees it)
            p = s.params
            ranks = int(p.logprobs is not None)
            row = s.sampling_row = (*_request_fields(p), _int64(s.seed), 0, slot, p.min_tokens, ranks)
        flat += row
        flat[_COUNTER_FROM_END] = s.num_generated
    return SamplingTensors.from_flat(rows, flat)


_SLOT = FIELDS.index("slots")
_COUNTER_FROM_END = FIELDS.index("counters") - len(FIELDS)


_FIELDS_OF: dict[int, tuple[SamplingParams, tuple[int, ...]]] = {}


def _request_fields(p: SamplingParams) -> tuple[int, ...]:
    """A request's float fields (as float32 bits) and top_k, cached by identity: requests share
    their SamplingParams, and a step packs every row."""
    hit = _FIELDS_OF.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    fields = (
        *float_bits(
            p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty
        ),
        p.top_k,
    )
    if len(_FIELDS_OF) >= 4096:
        _FIELDS_OF.clear()
    _FIELDS_OF[id(p)] = (p, fields)  # holds p, so its id is not reused while cached
    return fields


@dataclass(slots=True)
class BatchTraits:
    """What a decode batch's parameters decide once per batch list (a steady batch keeps its list):
    whether some row always needs the general sampler, the rows whose min_tokens may still hold, and
    whether any row asks for top-k logprobs. At batch 256 with a SamplingParams per row, deciding
    them every step was the largest part of a greedy step's host time on the H200."""

    seqs: list[Sequence] | None = None  # held: its id is not reused while cached
    always: bool = False
    min_rows: list[Sequence] = field(default_factory=list)
    top: bool = False
    guided: bool = False  # some row follows a grammar
    words: bool = False  # some row has bad words of several tokens
    lora_slots: list[int] | None = None  # each row's LoRA slot, when some row has an adapter
    _lora_rows: torch.Tensor | None = None  # lora_slots padded to a step's rows

    def of(self, seqs: list[Sequence]) -> tuple[bool, bool]:
        """(needs the general sampler this step, wants top-k logprobs)."""
        if self.seqs is not seqs:
            always, decided = False, {}
            for seq in seqs:
                p = seq.params
                hit = decided.get(id(p))
                if hit is None:
                    hit = decided[id(p)] = _general_for_any_row(p)
                always = always or hit
            self.seqs, self.always, self.top = seqs, always, wants_top_logprobs(seqs)
            self.guided = any(s.guided is not None for s in seqs)
            self.words = any(map(bans_words, seqs))
            slots = [s.lora_slot for s in seqs]
            self.lora_slots = slots if any(slot >= 0 for slot in slots) else None
            self._lora_rows = None
            self.min_rows = [] if always else [s for s in seqs if s.params.min_tokens]
        general = self.always or any(
            len(s.output_ids) + s.num_pending < s.params.min_tokens for s in self.min_rows
        )
        return general, self.top

    def lora_rows(self, rows: int) -> torch.Tensor | None:
        """The batch's LoRA slots padded to `rows` (padding: -1); None when no row has an adapter."""
        if self.lora_slots is None:
            return None
        if self._lora_rows is None or self._lora_rows.shape[0] != rows:
            self._lora_rows = lora_rows(self.lora_slots, rows)
        return self._lora_rows


def lora_rows(slots: list[int], rows: int) -> torch.Tensor | None:
    """Rows' LoRA slots padded to `rows` with -1; None when none is set."""
    if all(s < 0 for s in slots):
        return None
    return torch.tensor(slots + [-1] * (rows - len(slots)), dtype=torch.int64)


def decode_step(
    seqs: list[Sequence],
    packed: torch.Tensor,
    rows: int,
    uses_prev: bool,
    guided: bool,
    slots: PenaltySlots | None = None,
    kept: SamplingRows | None = None,
    decided: tuple[bool, bool] | None = None,
    words: bool | None = None,
    lora: torch.Tensor | None = None,
) -> DecodeStep:
    """A decode step's payload: the greedy fast path unless some row needs the general sampler.
    `kept`: the executor's rows of the last step, reused when the batch is the same; `decided`: the
    batch's (general sampler, top-k logprobs), and `words` whether some row bans bad words of
    several tokens, from its BatchTraits; `lora` the rows' LoRA slots (BatchTraits.lora_rows)."""
    general, top = decided if decided is not None else (any_needs_general(seqs), wants_top_logprobs(seqs))
    sampling = None
    if general and kept is not None:
        sampling = kept.tensors(seqs, rows, slots)
    elif general:
        sampling = sampling_tensors(seqs, rows, slots)
    words = any(map(bans_words, seqs)) if words is None else words
    return DecodeStep(len(seqs), packed, sampling, uses_prev, guided, top, words, lora)


def penalty_fill(batch: ScheduledBatch, slots: PenaltySlots) -> PenaltyFill | None:
    """The table work of a prefill batch: a sequence whose first chunk this is (admitted, or
    recomputed after preemption; it starts after the tokens the prefix cache held) gets its slot and
    enters every token it has."""
    entries = []
    for seq, start in zip(batch.seqs, batch.starts, strict=True):
        if start != seq.prefix_hit or not keeps_penalty_state(seq):
            continue
        p = seq.params
        stop = list(p.stop_token_ids) + ([] if p.ignore_eos else sorted(seq.eos_ids))
        tokens = seq.prompt_ids + seq.output_ids
        stop = stop if p.min_tokens else []
        entries.append((slots.assign(seq), len(seq.prompt_ids), tokens, stop, seq.biases))
    if not entries:
        return None
    fill = PenaltyFill(
        torch.tensor([e[0] for e in entries], dtype=torch.int64),
        torch.tensor([e[1] for e in entries], dtype=torch.int64),
        torch.tensor([len(e[2]) for e in entries], dtype=torch.int64),
        torch.tensor([t for e in entries for t in e[2]], dtype=torch.int64),
        _padded([e[3] for e in entries]),
    )
    biases = [e[4] for e in entries]
    if any(b is not None for b in biases):
        fill.exclusive = torch.tensor([b is not None and b.exclusive for b in biases], dtype=torch.int64)
        fill.bias_ids = _padded([list(b.ids) if b is not None else [] for b in biases])
        values = [list(float_bits(*b.values)) if b is not None else [] for b in biases]
        fill.bias_bits = _padded(values)
        if any(b is not None and b.sequences for b in biases):
            fill.words = _words([b.sequences if b is not None else () for b in biases])
    return fill


def _words(rows: list[tuple[tuple[int, ...], ...]]) -> torch.Tensor:
    """Each row's word sequences right-aligned in WORD_TOKENS columns, ANY left of them; [N, K,
    WORD_TOKENS], K the most sequences of a row, -1 rows where a row has fewer."""
    k = max(map(len, rows))
    out = torch.full((len(rows), k, WORD_TOKENS), -1, dtype=torch.int64)
    for i, seqs in enumerate(rows):
        for j, ids in enumerate(seqs):
            out[i, j] = torch.tensor([ANY] * (WORD_TOKENS - len(ids)) + list(ids))
    return out


def _padded(rows: list[list[int]]) -> torch.Tensor:
    """Rows of ints as one int64 tensor [len(rows), longest], -1 padded."""
    width = max(map(len, rows))
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], dtype=torch.int64).view(len(rows), width)


def prefill_step(
    batch: ScheduledBatch,
    block_size: int,
    slots: PenaltySlots | None = None,
    src_rows: dict[int, int] | None = None,
) -> tuple[PrefillStep, list[Sequence]]:
    """A prefill batch's inputs, and the sequences that sample a token (in row order).

    Per sequence, list slices; per token, numpy: a step of a thousand tokens stays a few host µs
    per sequence, not per token. A decoding sequence whose last token is still being sampled
    (Scheduler.admit_beside) takes it from the step in flight: `src_rows` names its row there.
    """
    bs = block_size
    starts = np.asarray(batch.starts, dtype=np.int64)
    lens = np.asarray(batch.lens, dtype=np.int64)
    ends = starts + lens
    width = int(-(-ends.max() // bs))
    tables = np.zeros((len(batch.seqs), width), dtype=np.int64)
    ids: list[int] = []
    logits_rows, sampled = [], []
    offset = 0
    fill = penalty_fill(batch, slots) if slots is not None else None
    pending: list[tuple[int, int]] = []  # (token index in the step, row of the step in flight)
    for r, (seq, start, n, samples) in enumerate(
        zip(batch.seqs, batch.starts, batch.lens, batch.samples, strict=True)
    ):
        known = len(seq.prompt_ids) + len(seq.output_ids)
        if start + n > known:  # only a rider's one token, the one its step in flight samples
            if src_rows is None or seq.seq_id not in src_rows or start + n != known + 1:
                raise RuntimeError(f"sequence {seq.seq_id}: tokens {start}..{start + n} are not all known")
            ids += seq.token_slice(start, known)
            pending.append((offset + n - 1, src_rows[seq.seq_id]))
            ids.append(0)
        else:
            ids += seq.token_slice(start, start + n)
        table = seq.block_table[:width]
        tables[r, : len(table)] = table
        offset += n
        if samples:
            logits_rows.append(offset - 1)
            sampled.append(seq)
        seq.num_computed = start + n
    owner = np.repeat(np.arange(len(lens)), lens)  # each token's sequence (row of `tables`)
    positions = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(offset)
    cache_slots = tables[owner, positions // bs] * bs + positions % bs
    general = any_needs_general(sampled)
    step = PrefillStep(
        torch.tensor(ids, dtype=torch.int64),
        *(torch.from_numpy(v) for v in (positions, cache_slots, tables, ends, lens)),
        torch.tensor(logits_rows, dtype=torch.int64),
        sampling=sampling_tensors(sampled, len(sampled), slots) if general else None,
        top_logprobs=wants_top_logprobs(sampled),
        penalty=fill,
        words=any(map(bans_words, sampled)),
        pending=torch.tensor(pending, dtype=torch.int64).view(-1, 2) if pending else None,
        lora=_token_lora(batch.seqs, lens),
    )
    return step, sampled


def _token_lora(seqs: list[Sequence], lens: np.ndarray) -> torch.Tensor | None:
    slots = [s.lora_slot for s in seqs]
    if all(s < 0 for s in slots):
        return None
    return torch.from_numpy(np.repeat(np.asarray(slots, dtype=np.int64), lens))


def stage(
    packed: torch.Tensor,
    seqs,
    src_rows: dict[int, int],
    block_size: int,
    owners: list[tuple[int, int, int]] | None = None,
) -> None:
    """Fill the packed host buffer for `seqs`; rows past them become padding that writes the null slot.

    `owners[r]` remembers whose block table row r holds (sequence id, table epoch, blocks written), so a buffer
    staged again for the same batch rewrites only the tables that grew: at batch 64 the table
    copies were most of the host's staging time.
    """
    arr = packed.numpy()
    n = len(seqs)
    arr[n:, :FIXED_COLUMNS] = (0, -1, 0, 0, 1)
    rows = []  # one pass, one row tuple in column order per sequence: this runs every decode step
    for seq in seqs:
        p = len(seq.prompt_ids) + len(seq.output_ids) + seq.num_pending - 1
        src = src_rows.get(seq.seq_id, -1) if seq.num_pending else -1
        token = -1 if src >= 0 else seq.token_at(p)
        rows.append((token, src, p, seq.block_table[p // block_size] * block_size + p % block_size, p + 1))
    if rows:
        arr[:n, :FIXED_COLUMNS] = rows
    stage_tables(arr, seqs, owners)


def stage_steady(
    packed: torch.Tensor, last: torch.Tensor, seqs, block_size: int, owners: list[tuple[int, int, int]] | None
) -> None:
    """stage() for the decode step after `last`'s (the same sequences, in the same rows, the same
    shape): each row feeds the token that step samples in its own row, one position further on, so
    the fixed columns follow from `last`'s by vector ops. `owners` None: this buffer's block tables
    are current (nothing grew since it was staged for these sequences)."""
    arr, n = packed.numpy(), len(seqs)
    cols = arr[:n, :FIXED_COLUMNS]
    cols[:] = last.numpy()[:n, :FIXED_COLUMNS]
    cols[:, 0] = -1  # token: taken from the step in flight
    cols[:, 1] = np.arange(n)  # its row there
    cols[:, 2:] += 1  # position, cache slot, context length
    # A position that opens a block takes its slot from the table (the scheduler's horizon keeps
    # these to blocks already allocated).
    for r in np.flatnonzero(cols[:, 2] % block_size == 0).tolist():
        p = int(cols[r, 2])
        cols[r, 3] = seqs[r].block_table[p // block_size] * block_size
    arr[n:, :FIXED_COLUMNS] = (0, -1, 0, 0, 1)
    if owners is not None:
        stage_tables(arr, seqs, owners)


def stage_tables(arr: np.ndarray, seqs, owners: list[tuple[int, int, int]] | None) -> None:
    """Block tables into the packed rows, skipping rows whose owner says they are already there."""
    n, width = len(seqs), arr.shape[1] - FIXED_COLUMNS
    for r, seq in enumerate(seqs):
        table = seq.block_table
        k = min(len(table), width)
        owner = (seq.seq_id, seq.table_epoch, k)
        if owners is not None and owners[r] == owner:
            continue
        # Entries past the live blocks are never read unmasked, so stale ones need no clearing.
        arr[r, FIXED_COLUMNS : FIXED_COLUMNS + k] = table[:k]
        if owners is not None:
            owners[r] = owner
    padding = (-1, 0, 0)
    if owners is None or any(owner != padding for owner in owners[n:]):
        arr[n:, FIXED_COLUMNS:] = 0
        if owners is not None:
            owners[n:] = [padding] * (len(owners) - n)
