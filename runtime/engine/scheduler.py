"""Continuous batching: waiting and running queues, chunked prefill, decode, preemption by recompute."""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from ..runner.kv_cache import BlockAllocator
from ..runner.prefix_cache import PrefixCachingAllocator, Walk, root_for
from .lora_slots import LoRASlots
from .sequence import Sequence, Status

log = logging.getLogger("fastpath.scheduler")


@dataclass(slots=True)
class ScheduledBatch:
    phase: str  # "prefill" | "decode"
    seqs: list[Sequence]
    # prefill: tokens [start, start + len) of each sequence are computed this step
    starts: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    # which sequences sample a token this step (a prefill chunk short of the prompt's end does not)
    samples: list[bool] = field(default_factory=list)
    # A decode batch from continue_decode: the scheduler's epoch it was built in, and for how many
    # more steps the same sequences continue with no limit reached and no block to allocate.
    epoch: int = -1
    horizon: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(self.lens) if self.phase == "prefill" else len(self.seqs)


class Scheduler:
    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        max_batch_size: int,
        max_num_batched_tokens: int,
        mixed_batches: bool = False,
        lora: LoRASlots | None = None,
    ) -> None:
        self.allocator = allocator
        # The device's LoRA slots (enable_lora): a batch runs at most max_loras adapters.
        self.lora = lora
        # Prefix caching, when the allocator remembers blocks (runner/prefix_cache.py).
        self.prefix_cache = allocator if isinstance(allocator, PrefixCachingAllocator) else None
        # A prefill step also carries each decoding sequence's next token (as a one-token chunk), so
        # running requests keep their pace while new ones are prefilled.
        self.mixed_batches = mixed_batches
        self.block_size = block_size
        self.max_batch_size = max_batch_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Bumped whenever the running list or a block table changes: a steady decode batch built in
        # the same epoch is still exact (continue_decode's fast path).
        self.epoch = 0

    def add(self, seq: Sequence) -> str | None:
        """Queue `seq`; why it cannot run (its adapter could not be read), in which case it is not queued."""
        if self.lora is not None:
            problem = self.lora.enter(seq)
            if problem is not None:
                return problem
        self.waiting.append(seq)
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- blocks -----------------------------------------------------------------------------------

    def _blocks_for(self, seq: Sequence, num_tokens: int) -> int:
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def _grow(self, seq: Sequence, num_tokens: int) -> bool:
        need = self._blocks_for(seq, num_tokens)
        if need > self.allocator.num_free:
            return False
        if need:
            seq.block_table.extend(self.allocator.allocate(need))
            self.epoch += 1
        return True

    def release(self, seq: Sequence) -> None:
        self.epoch += 1
        if self.prefix_cache is not None and seq.block_table:
            # Its whole blocks, prompt and output, stay findable: a conversation's next turn
            # resends them as its prompt.
            self._remember(seq, seq.num_computed)
            seq.prefix_walk = None
        self.allocator.free(seq.block_table)
        seq.block_table = []
        seq.table_epoch += 1
        if self.lora is not None:
            self.lora.release(seq)
        if seq in self.running:
            self.running.remove(seq)

    def finish(self, seq: Sequence, reason: str | None = None) -> None:
        seq.status = Status.FINISHED
        if reason is not None:
            seq.finish_reason = reason
        self.release(seq)
        if self.lora is not None:
            self.lora.leave(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a request that nobody waits for any more (a stream closed early)."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.finish(seq, "abort")

    def _preempt(self, seq: Sequence) -> None:
        # Recompute: the KV is dropped and the prompt plus outputs so far are prefilled again.
        self.release(seq)
        seq.num_computed = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        log.debug("preempted sequence %d (%d tokens)", seq.seq_id, seq.num_tokens)

    # --- scheduling -------------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch | None:
        """The next step, with every token known (no step in flight)."""
        return self._schedule_prefill() or self._schedule_decode()

    def _schedule_prefill(self) -> ScheduledBatch | None:
        batch = ScheduledBatch("prefill", [])
        budget = self.max_num_batched_tokens
        # Sequences part-way through a chunked prefill go first, then new admissions in arrival order.
        candidates = [s for s in self.running if s.num_tokens - s.num_computed > 1]
        admitting = bool(self.waiting) and len(self.running) < self.max_batch_size
        if not candidates and not admitting:
            return None
        decoding = 0
        if self.mixed_batches:  # decoding sequences ride along first: one token each
            for seq in self.running:
                if seq.num_tokens - seq.num_computed == 1 and budget > 0:
                    budget -= self._add_chunk(batch, seq, budget)
            decoding = len(batch.seqs)
        for seq in candidates:
            if budget <= 0:
                break
            # A prompt already under way takes what the free blocks hold, not all or nothing.
            budget -= self._add_chunk(batch, seq, min(budget, self._room(seq)))
        self._admit(batch, budget)
        if len(batch.seqs) == decoding:
            return None  # nothing to prefill after all: a plain decode step (graphs) does the rest
        self.remember_prefill(batch)
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int, unguided: bool = False) -> int:
        """Waiting sequences into `batch` in arrival order, within `budget` tokens; how many. With
        `unguided`, admission stops at the first guided one. One whose LoRA adapter finds no slot
        keeps its place in the queue while those behind it go on (vLLM's scheduler does so too)."""
        admitted = 0
        skipped: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            if unguided and seq.guided is not None:
                break
            if self.lora is not None and not self.lora.can_take(seq):
                skipped.append(self.waiting.popleft())
                continue
            taken = self._add_chunk(batch, seq, budget)
            if not taken:
                break
            if self.lora is not None:
                self.lora.acquire(seq)
            self.waiting.popleft()
            seq.status = Status.RUNNING
            if seq.scheduled_at is None:  # for queue time; a preempted sequence keeps its first
                seq.scheduled_at = time.monotonic()
            self.running.append(seq)
            self.epoch += 1
            budget -= taken
            admitted += 1
        self.waiting.extendleft(reversed(skipped))
        return admitted

    def admit_beside(self, prev: ScheduledBatch) -> ScheduledBatch | None:
        """A prefill step of waiting requests, to launch while the decode step `prev` is in flight;
        None when the host must read `prev` back first.

        Every decoding sequence rides along with the token `prev` is sampling for it, which the step
        takes from the device (steps.py, `pending`): admitting costs the GPU no wait for the host.
        Only a steady batch with no grammar qualifies: a guided row's mask needs its last token on
        the host, and a batch that must preempt needs the full scheduler.
        """
        if not self.mixed_batches or prev.phase != "decode":
            return None
        if not self.waiting or len(self.running) >= self.max_batch_size:
            return None
        if not set(map(id, prev.seqs)).issuperset(map(id, self.running)):
            return None
        riders = []
        for s in prev.seqs:
            if s.status is Status.FINISHED:
                continue
            if s.guided is not None:
                return None
            n = len(s.prompt_ids) + len(s.output_ids) + s.num_pending
            if n >= s.length_limit:
                continue  # its last token is in flight: it samples nothing more
            riders.append((s, n))
        budget = self.max_num_batched_tokens - len(riders)
        if budget <= 0 or sum(self._blocks_for(s, n) for s, n in riders) > self.allocator.num_free:
            return None
        batch = ScheduledBatch("prefill", [])
        for s, n in riders:
            self._grow(s, n)
            batch.seqs.append(s)
            batch.starts.append(n - 1)  # the token in flight: it enters the cache in this step
            batch.lens.append(1)
            batch.samples.append(True)
        if not self._admit(batch, budget, unguided=True):
            return None  # the grown blocks stay: the next step of these sequences needs them anyway
        self.remember_prefill(batch)
        return batch

    def _room(self, seq: Sequence) -> int:
        """How many more tokens of `seq` its blocks and the free ones can hold."""
        return (len(seq.block_table) + self.allocator.num_free) * self.block_size - seq.num_computed

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        reuses = self.prefix_cache is not None and seq.num_computed == 0 and not seq.block_table
        if reuses:
            self._reuse_prefix(seq)
        remaining = seq.num_tokens - seq.num_computed
        n = min(remaining, budget)
        if n <= 0 or not self._grow(seq, seq.num_computed + n):
            if reuses and seq.block_table:  # not admitted after all: it holds no blocks while it waits
                self.allocator.free(seq.block_table)
                seq.block_table, seq.num_computed, seq.prefix_hit = [], 0, 0
            return 0
        # A request's first admission only: not a recompute after preemption, nor the executor's probes.
        if reuses and seq.scheduled_at is None and seq.seq_id >= 0:
            self.prefix_cache.queried_tokens += seq.num_known
            self.prefix_cache.hit_tokens += seq.prefix_hit
            seq.num_cached_tokens = seq.prefix_hit
        batch.seqs.append(seq)
        batch.starts.append(seq.num_computed)
        batch.lens.append(n)
        batch.samples.append(n == remaining)
        return n

    def _reuse_prefix(self, seq: Sequence) -> None:
        """Start `seq` from the cached blocks that hold its first tokens; at least its last token is
        computed, so the step has its logits."""
        bs = self.block_size
        known = seq.prompt_ids + seq.output_ids
        root = self._prefix_root(seq)
        blocks = self.prefix_cache.match(known, min(seq.num_tokens - 1, len(known)) // bs, root)
        seq.block_table = blocks
        seq.num_computed = seq.prefix_hit = len(blocks) * bs
        seq.prefix_walk = Walk(0, root)
        if blocks:
            self.epoch += 1

    def _prefix_root(self, seq: Sequence) -> tuple[int | str, int]:
        return root_for(self.lora.namespace(seq.lora) if self.lora is not None else 0, seq.cache_salt)

    def _remember(self, seq: Sequence, computed: int) -> None:
        """Remember `seq`'s whole blocks among its first `computed` tokens that the host knows."""
        known = len(seq.prompt_ids) + len(seq.output_ids)
        full = min(computed, known, len(seq.block_table) * self.block_size) // self.block_size
        walk = seq.prefix_walk if seq.prefix_walk is not None else Walk(0, self._prefix_root(seq))
        if full > walk.blocks:
            tokens = seq.prompt_ids + seq.output_ids
            seq.prefix_walk = self.prefix_cache.remember(seq.block_table, tokens, full, walk)

    def remember_prefill(self, batch: ScheduledBatch) -> None:
        """After a prefill batch is built: its chunks' whole blocks become findable for later steps
        (not this one's other sequences, whose step writes them at the same time)."""
        if self.prefix_cache is not None:
            for seq, start, n in zip(batch.seqs, batch.starts, batch.lens, strict=True):
                self._remember(seq, start + n)

    def _schedule_decode(self) -> ScheduledBatch | None:
        if not self.running:
            return None
        # A sequence part-way through its prompt never decodes: the rest of its prompt is not in the
        # cache. It found no free block for its next chunk; the decoders free some as they finish.
        seqs = [s for s in self.running if s.num_tokens - s.num_computed <= 1]
        if not seqs:
            return self._make_room_for_prefill()
        # Each sequence needs a cache slot for the token it feeds; preempt the newest running one
        # (a prompt under way included) until they fit.
        while True:
            need = sum(self._blocks_for(s, s.num_tokens) for s in seqs)
            if need <= self.allocator.num_free:
                break
            if len(self.running) == 1:
                raise RuntimeError(
                    f"KV cache too small: sequence {seqs[0].seq_id} needs {need} more blocks, "
                    f"{self.allocator.num_free} free of {self.allocator.num_blocks}"
                )
            victim = self.running[-1]
            self._preempt(victim)
            if victim in seqs:
                seqs.remove(victim)
            if not seqs:
                return self._make_room_for_prefill()
        for s in seqs:
            self._grow(s, s.num_tokens)
        return ScheduledBatch("decode", seqs, samples=[True] * len(seqs))

    def _make_room_for_prefill(self) -> ScheduledBatch:
        """Every running sequence is part-way through its prompt and none found a free block: preempt
        the newest until the oldest's next chunk fits."""
        head = self.running[0]
        while len(self.running) > 1:
            self._preempt(self.running[-1])
            batch = self._schedule_prefill()
            if batch is not None:
                return batch
        raise RuntimeError(
            f"KV cache too small: sequence {head.seq_id} has {head.num_tokens} tokens, "
            f"{self.allocator.num_blocks - 1} blocks of {self.block_size} hold "
            f"{(self.allocator.num_blocks - 1) * self.block_size}"
        )

    def continue_decode(self, prev: ScheduledBatch) -> ScheduledBatch | None:
        """The next decode step while `prev` is still in flight, or None when the host must catch up first.

        Only a steady batch continues: the same running sequences, none admitted, none preempted.
        Stops known in advance (max_tokens, max_seq_len) are honoured here; end-of-sequence tokens are
        found one step late, and the extra token they computed is dropped.
        """
        if prev.phase != "decode" and not all(prev.samples):
            return None
        if self.waiting and len(self.running) < self.max_batch_size:
            return None  # room to admit: let the full scheduler run
        if prev.horizon > 0 and prev.epoch == self.epoch:
            # Nothing finished, joined or grew since `prev`, and no sequence of it reaches a limit
            # or a block boundary this step: the same sequences go on, with no pass over them.
            return ScheduledBatch("decode", prev.seqs, samples=prev.samples, epoch=self.epoch,
                                  horizon=prev.horizon - 1)  # fmt: skip
        if not set(map(id, prev.seqs)).issuperset(map(id, self.running)):
            return None
        # One pass, as cheap as it can be: at a large batch some row crosses a block boundary nearly
        # every step. A row within a block of its table's end takes its next block now (while blocks
        # are free beyond what this step and the head of the queue need), so the steady run that
        # follows lasts about a block's worth of steps, not until the next row's boundary.
        bs, seqs, growing, ahead, need = self.block_size, [], [], [], 0
        # Steps until a length limit; until a block boundary, without and with the blocks ahead.
        limits = base = grown = 1 << 30
        finished = Status.FINISHED
        for s in prev.seqs:
            if s.status is finished:
                continue
            n = len(s.prompt_ids) + len(s.output_ids) + s.num_pending
            end = s.length_limit
            if n >= end:
                continue  # its last token is in flight
            seqs.append(s)
            blocks = len(s.block_table)
            room = blocks * bs
            if n > room:
                short = -(-n // bs) - blocks
                growing.append((s, short))
                need += short
                room += short * bs
            # The steps after this one the sequence takes as it is: each adds a token to n.
            if end - n - 1 < limits:
                limits = end - n - 1
            head = room - n
            if head < base:
                base = head
            # (A row's last token is never fed, so its table never needs a slot for it.)
            if head < bs and room < end - 1:
                ahead.append(s)
                head += bs
            if head < grown:
                grown = head
        if not seqs or need > self.allocator.num_free:
            return None
        reserve = -(-self.waiting[0].num_tokens // bs) if self.waiting else 0
        if need + len(ahead) + reserve > self.allocator.num_free:
            ahead, grown = [], base
        for s, short in growing:
            s.block_table.extend(self.allocator.allocate(short))
        for s, block in zip(ahead, self.allocator.allocate(len(ahead)), strict=True):
            s.block_table.append(block)
        if growing or ahead:
            self.epoch += 1
        if prev.phase == "decode" and len(seqs) == len(prev.seqs):
            seqs = prev.seqs  # the same rows: the executor stages them from its last buffer
        return ScheduledBatch(
            "decode", seqs, samples=[True] * len(seqs), epoch=self.epoch, horizon=min(limits, grown)
        )
