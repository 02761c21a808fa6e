"""Per-request sampling state on the device: which tokens a request's prompt holds, how often it has
generated each token, its stop tokens (for min_tokens), and its token biases (logit_bias, and -inf
for the tokens allowed_token_ids and bad_words ban), and its bad words of several tokens.

One int32 entry per (slot, token) and a float32 bias beside it (layout: kernels/sampling.py), and a
bit per entry saying it is not zero, so the sampling kernels read a dense row of bits and only the
few entries that are set.
Slot 0 is the shared, always-empty row of requests without penalties and of graph padding.

A bad word of several tokens bans its last token only after its first ones, as vLLM does: a slot
holds its words, right-aligned (`words` [slots, W, L]), and its last L - 1 generated tokens
(`recent`). Before a step that samples such a row, `ban_words` gives each word whose first tokens
are the row's last ones a -inf bias on its last token; `lift_words` puts the entries back after
sampling, and `remember` shifts the sampled tokens into `recent`. All tensor ops on the device, no
sync, in stream order with the steps: the host need not know a row's last token.

Rank 0 assigns slots (`assign`, at a sequence's first prefill chunk, also after preemption) and a
step's payload carries them, so every tensor-parallel rank fills and updates its own table the
same way: at prefill from the payload's tokens (`fill`), after each sampled token inside the step
(the sampler's record), in stream order with the steps that read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..kernels.sampling import BIAS_BIT, PROMPT_BIT, STOP_BIT

# A slot's bad words of several tokens: at most WORD_SEQUENCES token sequences (a word and its
# variant after a space count apart), each at most WORD_TOKENS long (engine/token_biases.py checks).
WORD_SEQUENCES = 128
WORD_TOKENS = 16
ANY = -2  # a `words` column left of a shorter word: it matches whatever the row generated


@dataclass(slots=True)
class PenaltyFill:
    """The sequences of a prefill step whose state is (re)built: those starting at token 0, on
    admission or after preemption. Each enters every token it has, whatever the chunk covers: the
    last one may reach the cache through a decode step. Host int64 tensors."""

    slots: torch.Tensor  # [N]
    prompt_lens: torch.Tensor  # [N] a sequence's first prompt_len tokens are its prompt
    lens: torch.Tensor  # [N] tokens each sequence has (prompt and generated)
    tokens: torch.Tensor  # [sum(lens)] those tokens, sequence after sequence
    stop_ids: torch.Tensor  # [N, E] tokens banned under min_tokens, -1 padded
    # A sequence's biases: 1 where only its listed tokens may follow (allowed_token_ids), then the
    # tokens [N, K] (-1 padded) and their biases as float32 bits [N, K] (-inf: banned).
    exclusive: torch.Tensor | None = None  # [N]
    bias_ids: torch.Tensor | None = None
    bias_bits: torch.Tensor | None = None
    # Bad words of several tokens [N, K, WORD_TOKENS]: right-aligned, ANY left of them, -1 rows
    # unused. Only beside biases (a request with such words has biases).
    words: torch.Tensor | None = None

    def tensors(self) -> tuple[torch.Tensor, ...]:
        head = (self.slots, self.prompt_lens, self.lens, self.tokens, self.stop_ids)
        if self.bias_ids is None:
            return head
        biases = (*head, self.exclusive, self.bias_ids, self.bias_bits)
        return biases if self.words is None else (*biases, self.words)


@dataclass(slots=True)
class WordBan:
    """What `ban_words` changed, for `lift_words`: flat indices of the entries of each row's words'
    last tokens [B, W], and their entries and bias bits before."""

    index: torch.Tensor
    entries: torch.Tensor
    bias_bits: torch.Tensor


class PenaltyTable:
    """The device table of one rank: `entries` [slots, V], `biases` [slots, V] beside them, and `bits`
    [slots, ceil(V / 32)]."""

    def __init__(self, num_slots: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        words = -(-vocab // 32)
        self._width = width = words * 32
        # Padded to whole words, so a word's entries are one view row (`_pack`); a slot's biases fill
        # the second half of its row (kernels/sampling.py's layout).
        self._padded = torch.zeros(num_slots, 2 * width, dtype=torch.int32, device=device)
        self.entries = self._padded[:, :vocab]
        self.biases = self._padded[:, width : width + vocab].view(torch.float32)
        self.bits = torch.zeros(num_slots, words, dtype=torch.int32, device=device)
        self._weights = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64), torch.arange(32)).to(
            device
        )
        self.words = torch.full(
            (num_slots, WORD_SEQUENCES, WORD_TOKENS), -1, dtype=torch.int32, device=device
        )
        self.recent = torch.full((num_slots, WORD_TOKENS - 1), -1, dtype=torch.int32, device=device)

    def fill(self, fill: PenaltyFill) -> None:
        """Clear the sequences' slots and enter their tokens and stop tokens."""
        dev = self.entries.device
        slots = fill.slots.tolist()
        self._padded[slots] = 0
        self.bits[slots] = 0
        self.words[slots] = -1
        self.recent[slots] = -1
        if fill.bias_ids is not None:
            self._bias(fill)
        stop = fill.stop_ids
        banned = (stop >= 0) & (stop < self.vocab)
        if bool(banned.any()):
            rows = fill.slots[:, None].expand_as(stop)[banned]
            self._set(rows.to(dev), stop[banned].to(dev), STOP_BIT)
        rows = fill.slots.repeat_interleave(fill.lens)
        starts = torch.cumsum(fill.lens, 0) - fill.lens
        position = torch.arange(len(fill.tokens)) - starts.repeat_interleave(fill.lens)
        prompt = position < fill.prompt_lens.repeat_interleave(fill.lens)
        if bool(prompt.any()):
            self._set(rows[prompt].to(dev), fill.tokens[prompt].to(dev), PROMPT_BIT)
        generated = fill.tokens[~prompt].to(dev)
        if generated.numel():
            ones = torch.ones_like(generated, dtype=torch.int32)
            self.entries.index_put_((rows[~prompt].to(dev), generated), ones, accumulate=True)
        self.bits[slots] = self._pack(slots)
        if fill.words is not None:
            self._words(fill, slots)

    def _words(self, fill: PenaltyFill, slots: list[int]) -> None:
        """Enter the words, the last tokens each sequence generated, and a bit in the summary for
        each word's last token (so the sampler reads its entry when `ban_words` sets it; an entry the
        bit marks that is zero changes nothing)."""
        dev = self.words.device
        k = fill.words.shape[1]
        self.words[slots, :k] = fill.words.to(torch.int32).to(dev)
        keep = WORD_TOKENS - 1
        ends = torch.cumsum(fill.lens, 0).tolist()
        spans = zip(ends, fill.lens.tolist(), fill.prompt_lens.tolist(), strict=True)
        recent = torch.full((len(slots), keep), -1, dtype=torch.int32)
        for i, (end, n, prompt) in enumerate(spans):
            generated = fill.tokens[end - n + prompt : end][-keep:]
            if generated.numel():
                recent[i, keep - generated.numel() :] = generated.to(torch.int32)
        self.recent[slots] = recent.to(dev)
        last = fill.words[:, :, -1].to(dev)
        marked = torch.zeros(len(slots), self._width, dtype=torch.bool, device=dev)
        rows = torch.arange(len(slots), device=dev)[:, None].expand_as(last)
        used = (last >= 0) & (last < self.vocab)
        marked[rows[used], last[used]] = True
        self.bits[slots] = self.bits[slots] | self._packed(marked)

    def ban_words(self, slots: torch.Tensor) -> WordBan:
        """A -inf bias on the last token of each word whose first tokens the row generated last
        (`slots` [B], the rows' slots on the device). Rows of slot 0 hold no words."""
        words = self.words.index_select(0, slots)  # [B, W, L]
        recent = self.recent.index_select(0, slots)[:, None, :]
        last = words[:, :, -1]
        head = words[:, :, :-1]
        hit = ((head == recent) | (head == ANY)).all(-1) & (last >= 0)
        index = slots[:, None] * self._padded.stride(0) + last.clamp_min(0).long()
        flat = self._padded.view(-1)
        entries = flat[index]
        bias_bits = flat[index + self._width]
        # Several words may end in one token, some hit and some not: max and min decide the same in
        # any order (an entry is non-negative, BIAS_BIT only raises it; -inf is the least bias).
        flat.scatter_reduce_(
            0, index.flatten(), torch.where(hit, entries | BIAS_BIT, entries).flatten(), "amax"
        )
        values = flat.view(torch.float32)
        banned = torch.where(hit, float("-inf"), bias_bits.view(torch.float32))
        values.scatter_reduce_(0, (index + self._width).flatten(), banned.flatten(), "amin")
        return WordBan(index, entries, bias_bits)

    def lift_words(self, ban: WordBan) -> None:
        """Undo `ban_words` after sampling, keeping the counts the sampler recorded meanwhile."""
        flat = self._padded.view(-1)
        now = flat[ban.index]
        # Repeated indices all write the same value: the entry before, with the count of now.
        flat[ban.index] = (now & ~BIAS_BIT) | (ban.entries & BIAS_BIT)
        flat[ban.index + self._width] = ban.bias_bits

    def remember(self, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Shift each row's sampled token into its slot's `recent`; rows of slot 0 write back what
        they read, so its repeats agree."""
        old = self.recent.index_select(0, slots)
        shifted = torch.cat([old[:, 1:], tokens[:, None].to(torch.int32)], dim=1)
        self.recent[slots] = torch.where((slots != 0)[:, None], shifted, old)

    def _bias(self, fill: PenaltyFill) -> None:
        dev = self.entries.device
        exclusive = fill.slots[fill.exclusive != 0].to(dev)
        if exclusive.numel():  # every token banned, then the listed ones set
            self.entries[exclusive] = BIAS_BIT
            self.biases[exclusive] = float("-inf")
        listed = (fill.bias_ids >= 0) & (fill.bias_ids < self.vocab)
        rows = fill.slots[:, None].expand_as(fill.bias_ids)[listed].to(dev)
        toks = fill.bias_ids[listed].to(dev)
        values = fill.bias_bits[listed].to(torch.int32).view(torch.float32).to(dev)
        self.biases[rows, toks] = values
        self._set(rows, toks, BIAS_BIT)

    def _set(self, rows: torch.Tensor, toks: torch.Tensor, flag: int) -> None:
        # Repeated (row, token) pairs all write the same value.
        self.entries[rows, toks] = self.entries[rows, toks] | flag

    def _pack(self, slots: list[int]) -> torch.Tensor:
        return self._packed(self._padded[slots, : self._width] != 0)

    def _packed(self, marked: torch.Tensor) -> torch.Tensor:
        """[n, width] bools as the summary's int32 words (bit 31 wraps to the sign)."""
        words = marked.view(marked.shape[0], -1, 32).long()
        return (words * self._weights).sum(-1).to(torch.int32)


class PenaltySlots:
    """Rank 0's host side: which slot each sequence with penalties or min_tokens holds.

    A slot is held from a sequence's first prefill chunk until the scheduler releases the sequence
    (finish, abort or preemption: each bumps `table_epoch`). `release` frees a slot at once; a
    slot whose sequence was released without it is taken back when slots run out.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = list(range(capacity, 0, -1))  # pop() hands out 1 first
        self._held: dict[int, tuple[Any, int, int]] = {}  # seq_id -> (sequence, epoch, slot)
        self.version = 0  # bumped whenever a slot changes hands: packed rows that name slots are stale

    def slot_of(self, seq: Any) -> int:
        held = self._held.get(seq.seq_id)
        return held[2] if held is not None and held[0] is seq else 0

    def assign(self, seq: Any) -> int:
        """The sequence's slot, for a prefill starting at its token 0 (it is cleared and refilled)."""
        held = self._held.get(seq.seq_id)
        if held is not None and held[0] is seq:
            slot = held[2]
        else:
            if not self._free:
                self._reclaim()
            if not self._free:
                raise RuntimeError(
                    f"penalty table full: {self.capacity} slots held by running sequences "
                    f"{sorted(self._held)}; it needs one per sequence of the batch"
                )
            slot = self._free.pop()
            self.version += 1
        self._held[seq.seq_id] = (seq, seq.table_epoch, slot)
        return slot

    def release(self, seq: Any) -> None:
        held = self._held.get(seq.seq_id)
        if held is not None and held[0] is seq:
            del self._held[seq.seq_id]
            self._free.append(held[2])
            self.version += 1

    def _reclaim(self) -> None:
        for seq, epoch, _ in list(self._held.values()):
            if seq.finished or seq.table_epoch != epoch:
                self.release(seq)
