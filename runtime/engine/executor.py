"""ExecutorCore: the hook-free step loop. It stages each scheduled batch as a payload for its
`ModelRunner`, launches it, and completes it when its tokens reach the host.

The loop overlaps: step n+1 is launched before step n is read back, whenever the batch is steady.
NativeExecutor reads hooks at run time; a generated Executor overrides the same methods with a
manifest's hooks compiled in.

Under tensor parallelism (`parallel`, see parallel/) rank 0 runs the scheduler and the loop; each
payload is broadcast before it runs, and the workers' runners run the same payloads on their shard.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..dispatch.dispatcher import NATIVE_EXTENSION, HostDispatcher
from ..hooks import ALL_OFF, RuntimeHooks
from ..model.lora_adapter import load_adapter
from ..parallel.messages import Op
from ..parallel.state import ParallelState, RankFailed, check_group
from ..runner.config import EngineConfig
from ..runner.decode_inputs import FIXED_COLUMNS, DecodeInputs
from ..runner.kv_cache import BlockAllocator, CacheFullError
from ..runner.prefix_cache import PrefixCachingAllocator
from ..runner.runner import ModelRunner
from ..runner.sampler import Sampled
from .adapter_store import AdapterStore
from .alternating import Alternating
from .lora_slots import LoRASlots
from .readback import Readback
from .sampling_params import SamplingParams
from .sampling_rows import SamplingRows
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence
from .steps import (
    BatchTraits,
    InflightStep,
    StepRecord,
    decode_step,
    most_top_logprobs,
    prefill_step,
    stage,
    stage_steady,
)

# 0: new requests wait for the host to read back the step in flight (Scheduler.admit_beside)
ADMIT_BESIDE_ENV = "FASTPATH_ADMIT_BESIDE"

log = logging.getLogger("fastpath.executor")

__all__ = ["ExecutorCore", "InflightStep", "StartupError", "StepRecord"]


class StartupError(RuntimeError):
    """Start-up (warmup, graph capture, after_warmup hooks) failed; the engine is not usable."""


class ExecutorCore:
    def __init__(
        self, config: EngineConfig, hooks: RuntimeHooks = ALL_OFF, parallel: ParallelState | None = None
    ) -> None:
        check_group(config.tensor_parallel_size, parallel)
        self.config = config
        self.hooks = hooks
        self.parallel = parallel
        self.dispatcher = self._make_dispatcher(config)
        self.runner = ModelRunner(
            config,
            self.dispatcher,
            parallel=parallel,
            prologue=self.decode_prologue,
            decode_from_embeds=self.starts_from_embeddings(),
        )
        blocks = self.runner.sizing.num_blocks
        self.allocator = (
            PrefixCachingAllocator(blocks, self.runner.block_size)
            if config.enable_prefix_caching
            else BlockAllocator(blocks)
        )
        mixed = config.mixed_batches
        self.scheduler = Scheduler(
            self.allocator,
            self.runner.block_size,
            config.max_batch_size,
            config.max_num_batched_tokens,
            mixed_batches=self._mixed_batches_by_default() if mixed is None else mixed,
            lora=self._lora_slots(config),
        )
        log.info(
            "mixed batches %s (%s)",
            "on" if self.scheduler.mixed_batches else "off",
            "as configured"
            if mixed is not None
            else "prefill attention in one launch: " + ("yes" if self.scheduler.mixed_batches else "no"),
        )
        # Admission without a wait for the host (Scheduler.admit_beside): one rank only, since the
        # workers of a tensor-parallel engine keep no step in flight to take tokens from.
        self.admits_beside = parallel is None and os.environ.get(ADMIT_BESIDE_ENV, "1") != "0"
        self.readback = Readback(self.dispatcher, config.device, parallel)
        self.in_warmup_guard = False
        # (packed inputs, whose block tables its rows hold) per (rows, cols)
        self._staging = Alternating(
            lambda key: (torch.zeros(*key, dtype=torch.int64, pin_memory=self.is_cuda), [(-1, 0, 0)] * key[0])
        )
        self._sampling_rows = SamplingRows(pinned=self.is_cuda)
        self._traits = BatchTraits()
        # The last decode step's sequences and packed buffer, and per staging buffer the batch and
        # scheduler epoch whose block tables it holds: a steady batch stages by vector ops.
        self._last_decode: tuple[list | None, torch.Tensor | None] = (None, None)
        self._tables_of: dict[int, tuple[list, int]] = {}
        # sampled, its rows, the top-k columns asked for, whether any row asked for logprobs
        self._rows_of: tuple[list | None, dict[int, int], int, bool] = (None, {}, 0, False)
        # A steady batch's stop tokens (any row's) and its rows that keep logprobs (_accept_steady).
        self._steady_of: tuple[list | None, np.ndarray, list[tuple[int, int]]] = (None, np.empty(0), [])
        self._host_buffers = Alternating(
            lambda key: torch.empty(key[0], dtype=key[1], pin_memory=self.is_cuda)
        )  # read-back, per (shape, dtype)
        self._closed = False
        self._loop_started = False
        self.pooled_tokens = 0  # prompt tokens embed() and encode() computed (pool)

    def _mixed_batches_by_default(self) -> bool:
        """On when a prefill's attention is one launch and a step has room for every decode beside it."""
        c = self.config
        return self.runner.fmha.batched_prefill() and c.max_num_batched_tokens >= c.max_batch_size

    # What hooks read (FusedDecodePrologue, health_check): the runner's, by the executor's names.
    @property
    def model(self):
        return self.runner.model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def is_cuda(self) -> bool:
        return self.runner.is_cuda

    @property
    def guided(self):
        return self.runner.guided

    @property
    def graphs(self):
        return self.runner.graphs

    def dispatch_extension(self) -> str:
        """The host-dispatch extension: the native binding, whose mode is chosen at run time.

        A generated executor returns its own package's extension, with the mode fixed at compile time.
        """
        return NATIVE_EXTENSION

    def _make_dispatcher(self, config: EngineConfig):
        ext = importlib.import_module(self.dispatch_extension())
        mode, policy = config.dispatch_mode, config.on_unsupported
        if ext.FIXED_MODE is not None:
            if mode not in (None, "auto", ext.FIXED_MODE):
                raise ValueError(
                    f"dispatch_mode={mode!r}, but {ext.__name__} is compiled for {ext.FIXED_MODE!r}"
                )
            mode = policy = None  # the extension's own
        else:
            mode, policy = mode or "auto", policy or "warn_once"
        dispatcher = HostDispatcher(mode, policy, extension=ext, device=config.device.type)
        log.info("host dispatch: %s backend (%s)", dispatcher.backend, dispatcher.reason)
        return dispatcher

    def starts_from_embeddings(self) -> bool:
        """Whether decode graphs start from embeddings: true when a prologue hook does the embedding lookup."""
        return False

    # --- start-up ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def warmup_guard(self) -> Iterator[None]:
        """Errors during start-up abort it cleanly: resources are released and a StartupError names the cause.

        With several ranks, every rank reports how its start-up went before any leaves the guard, so
        one rank's failure stops them all, and the error names the rank.
        """
        self.in_warmup_guard = True
        failure: Exception | None = None
        try:
            yield
        except Exception as exc:
            failure = exc
        finally:
            self.in_warmup_guard = False
        if self.parallel is not None:
            failure = self.parallel.agree(failure)
        if failure is not None:
            self.release()
            where = " on " if isinstance(failure, RankFailed) else ": "
            raise StartupError(f"start-up failed{where}{failure}") from failure

    def warmup(self) -> None:
        """Run every step kind once eagerly (kernel selection, lazy inits), then capture decode graphs."""
        if self.parallel is not None and not self.parallel.is_driver:
            from ..parallel.worker import serve

            serve(self.runner, self.parallel.channel, until=Op.WARMUP_DONE)  # rank 0's warmup steps
        else:
            probe = Sequence(
                -1, [1] * min(8, self.config.max_seq_len - 1), _PROBE_PARAMS, 0, frozenset(), 1 << 30
            )
            self.scheduler.add(probe)
            self.complete(self.launch(self.scheduler.schedule(), None))
            self.complete(self.launch(self.scheduler.schedule(), None))
            self.scheduler.finish(probe)
            if self.parallel is not None:
                self.parallel.send(Op.WARMUP_DONE)
        self.runner.capture_graphs()

    # --- the decode prologue seam -----------------------------------------------------------------

    def decode_prologue(self, inputs: DecodeInputs) -> None:
        """The seam a decode_prologue hook replaces; the native executor reads its hook here."""
        self.native_decode_prologue(inputs)

    def native_decode_prologue(self, inputs: DecodeInputs) -> None:
        self.runner.native_prologue(inputs)

    def execution_stream_scope(self) -> contextlib.AbstractContextManager:
        return self.runner.execution_stream_scope()

    # --- one step ---------------------------------------------------------------------------------

    def launch(self, batch: ScheduledBatch, prev: InflightStep | None) -> InflightStep:
        self._load_pending_adapters()
        if batch.phase == "decode":
            out, sampled = self.launch_decode(batch, prev)
        else:
            out, sampled = self.launch_prefill(batch, prev)
        for seq in sampled:
            seq.num_pending += 1
        return self._read_back(batch, sampled, out)

    @staticmethod
    def _lora_slots(config: EngineConfig) -> LoRASlots | None:
        """The device's LoRA slots and the adapters' weights on the host (enable_lora), or None."""
        if not config.max_loras:
            return None

        def read(request):
            return load_adapter(request.lora_path, config.model, config.max_lora_rank, config.dtype)

        return LoRASlots(config.max_loras, AdapterStore(read, config.max_cpu_loras))

    def _take_lora_slot(self, seq: Sequence, lora: Any) -> bool:
        """A sequence outside the scheduler (pooling, prompt logprobs) given `lora`'s slot as the
        scheduler gives one: its weights read and checked now (ValueError), then a slot; False, its pin
        given back, while no slot is free."""
        slots = self.scheduler.lora
        if slots is None:
            raise ValueError("lora_request given, but LoRA adapters are off (enable_lora)")
        seq.lora = lora
        problem = slots.enter(seq)
        if problem is not None:
            raise ValueError(problem)
        if not slots.can_take(seq):
            slots.leave(seq)
            return False
        slots.acquire(seq)
        return True

    def _give_back_lora_slot(self, seq: Sequence) -> None:
        if seq.lora is not None and self.scheduler.lora is not None:
            self.scheduler.lora.leave(seq)

    def _load_pending_adapters(self) -> None:
        if self.scheduler.lora is not None and self.scheduler.lora.loads:
            self._load_adapters()

    def _load_adapters(self) -> None:
        """The LoRA adapters the scheduler gave slots since the last step, into those slots, from the
        weights read when their requests entered (every rank takes its slice of them)."""
        lora = self.scheduler.lora
        for slot, request in lora.take_loads():
            log.info("LoRA adapter %r (id %d) into slot %d", request.lora_name, request.lora_int_id, slot)
            weights = lora.store.weights(request)
            if self.parallel is not None:
                self.parallel.send_adapter(slot, weights)
            self.runner.load_adapter(slot, weights)

    def launch_decode(self, batch: ScheduledBatch, prev: InflightStep | None):
        seqs, runner = batch.seqs, self.runner
        rows = runner.graph_rows(len(seqs))
        if rows is not None:
            width = runner.table_width
        else:
            rows = len(seqs)
            width = max(-(-s.num_tokens // runner.block_size) for s in seqs)
        packed, owners = self._staging_buffer(rows, FIXED_COLUMNS + width)
        epoch, last = self.scheduler.epoch, self._last_decode
        if prev is not None and prev.batch.seqs is seqs and last[0] is seqs and last[1].shape == packed.shape:
            # The same batch again (Scheduler.continue_decode's fast path): no pass over its rows,
            # and none over its block tables when this buffer holds them from the same epoch.
            held = self._tables_of.get(id(packed))
            current = held is not None and held[0] is seqs and held[1] == epoch
            stage_steady(packed, last[1], seqs, runner.block_size, None if current else owners)
        else:
            stage(packed, seqs, prev.rows if prev is not None else {}, runner.block_size, owners)
        self._last_decode = (seqs, packed)
        self._tables_of[id(packed)] = (seqs, epoch)  # the list itself: its id is not reused meanwhile
        for seq in seqs:
            seq.num_computed = len(seq.prompt_ids) + len(seq.output_ids) + seq.num_pending
        decided = self._traits.of(seqs)  # once per batch list, but for rows under min_tokens
        guided = runner.guided is not None and self._traits.guided
        step = decode_step(
            seqs,
            packed,
            rows,
            prev is not None,
            guided,
            runner.penalty_slots,
            self._sampling_rows,
            decided,
            self._traits.words,
            self._traits.lora_rows(rows),
        )
        if guided:
            runner.guided.enqueue(list(seqs), rows)
        if self.parallel is not None:
            self.parallel.send(Op.DECODE, step)
        return runner.run_decode(step, prev.tokens if prev is not None else None), seqs

    def launch_prefill(self, batch: ScheduledBatch, prev: InflightStep | None = None):
        """`prev`: the step in flight, when the batch's decoding sequences take its tokens (admit_beside)."""
        src = prev.rows if prev is not None else None
        step, sampled = prefill_step(batch, self.runner.block_size, self.runner.penalty_slots, src)
        if self.parallel is not None:
            self.parallel.send(Op.PREFILL, step)
        guided = self.runner.guided is not None and any(s.guided is not None for s in sampled)
        prev_tokens = prev.tokens if prev is not None and step.pending is not None else None
        return self.runner.run_prefill(step, sampled if guided else None, prev_tokens), sampled

    def _read_back(self, batch: ScheduledBatch, sampled: list[Sequence], out: Sampled) -> InflightStep:
        if self._rows_of[0] is not sampled:  # a steady batch keeps its list, its rows and its k
            self._rows_of = (
                sampled,
                {s.seq_id: i for i, s in enumerate(sampled)},
                most_top_logprobs(sampled),
                any(s.params.logprobs is not None for s in sampled),
            )
        _, rows, k, ranked = self._rows_of
        top_ids, top_logprobs = out.top_ids, out.top_logprobs
        if top_ids is None:
            k = 0
        elif k == 0:
            top_ids = top_logprobs = None
        # Whole rows: a column slice is strided, and copying one to the host costs a gather kernel
        # and a device allocation first. complete() converts only the k columns asked for.
        counts = out.rank_counts if ranked else None
        host = Sampled(
            *(
                None if t is None else self._to_host(t)
                for t in (out.tokens, out.logprobs, top_ids, top_logprobs, counts)
            )
        )
        ticket, event = self.readback.mark()
        return InflightStep(batch, sampled, out.tokens, rows, host, ticket, event, k)

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` on its way to pinned memory (two buffers per shape in turn)."""
        return self._host_buffers.next((tuple(t.shape), t.dtype)).copy_(t, non_blocking=True)

    def complete(self, step: InflightStep) -> StepRecord:
        """Wait for a step's tokens, hand them to their sequences, and retire finished sequences."""
        waited = time.perf_counter()
        self.readback.wait(step.ticket, step.event)
        waited = time.perf_counter() - waited
        self.dispatcher.check()  # a host callback's exception surfaces here, with its traceback
        record = StepRecord(step.batch.phase, step.batch.num_tokens, device_wait_s=waited)
        host = step.host
        tops = None
        if host.top_ids is not None:  # some row asked for top-k logprobs
            # Tuples: a sequence keeps one pair per token, and the cyclic collector stops tracking a
            # tuple of numbers, where every list would be traversed by each full collection.
            k = step.top_k  # the columns some row asked for (TOP_LOGPROBS were computed)
            ids, lps = host.top_ids[:, :k].tolist(), host.top_logprobs[:, :k].tolist()
            tops = list(zip(map(tuple, ids), map(tuple, lps), strict=True))
        # Rows that asked for no logprobs summed garbage: only rows that keep logprobs read theirs.
        # The greedy sampler's token is the argmax, which nothing beats.
        ranks = None if host.rank_counts is None else (host.rank_counts.numpy().sum(axis=1) + 1).tolist()
        if step.continues and self._accept_steady(step, record, tops, ranks):
            return record
        for i, (seq, token, logprob) in enumerate(
            zip(step.sampled, host.tokens.tolist(), host.logprobs.tolist(), strict=True)
        ):
            if seq.finished:
                continue  # it stopped one step earlier; this is the overlap loop's extra token
            seq.accept(
                token, logprob, tops[i] if tops is not None else None, ranks[i] if ranks is not None else 1
            )
            record.new_tokens.append((seq, token))
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                record.finished.append(seq)
        return record

    def _accept_steady(
        self, step: InflightStep, record: StepRecord, tops: list | None, ranks: list[int] | None = None
    ) -> bool:
        """Sequence.accept for a batch that goes on whole: unless some row's token could stop it (its
        stop ids, or EOS where it is not ignored), every row just takes its token (and logprobs),
        with no checks per row. False: some token could stop its row; the caller takes every row."""
        seqs = step.sampled
        if self._steady_of[0] is not seqs:
            stops, logprob_rows = set(), []
            for i, s in enumerate(seqs):
                p = s.params
                stops.update(p.stop_token_ids)
                if not p.ignore_eos:
                    stops.update(s.eos_ids)
                if p.logprobs is not None:
                    logprob_rows.append((i, p.logprobs))
            self._steady_of = (seqs, np.array(sorted(stops), dtype=np.int64), logprob_rows)
        _, stops, logprob_rows = self._steady_of
        host = step.host
        if stops.size and np.isin(host.tokens.numpy(), stops).any():
            return False
        tokens = host.tokens.tolist()
        for seq, token in zip(seqs, tokens, strict=True):
            seq.num_pending -= 1
            seq.output_ids.append(token)
        if logprob_rows:
            logprobs = host.logprobs.tolist()
            for i, k in logprob_rows:
                seq = seqs[i]
                seq.logprobs.append(logprobs[i])
                seq.ranks.append(ranks[i] if ranks is not None else 1)
                if k and tops is not None:
                    top = tops[i]
                    seq.top_logprobs.append(top if len(top[0]) == k else (top[0][:k], top[1][:k]))
        record.new_tokens = list(zip(seqs, tokens, strict=True))
        return True

    def _staging_buffer(self, rows: int, cols: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """A pinned staging buffer and the record of whose block tables its rows hold."""
        return self._staging.next((rows, cols))

    @torch.no_grad()
    def prompt_logits(
        self, prompt_ids: list[int], every_position: bool = False, lora: Any = None
    ) -> torch.Tensor:
        """Next-token logits after `prompt_ids` (fp32, on the host), outside the scheduler: for oracles and tests.

        `every_position`: the logits after each prefix of the prompt instead, [P, V] on the device in
        the model's dtype (a float32 copy of a long prompt's would be GBs; callers convert in chunks).
        `lora`: the LoRARequest to run the prompt with; CacheFullError while no slot is free for it.
        """
        seq = Sequence(-2, list(prompt_ids), _PROBE_PARAMS, 0, frozenset(), 1 << 30)
        try:
            if lora is not None and not self._take_lora_slot(seq, lora):
                raise CacheFullError(f"no LoRA slot is free for adapter {lora.lora_name!r}")
            self._load_pending_adapters()
            seq.block_table = self.allocator.allocate(-(-len(prompt_ids) // self.runner.block_size))
            batch = ScheduledBatch("prefill", [seq], [0], [len(prompt_ids)], [True])
            step, _ = prefill_step(batch, self.runner.block_size)
            if every_position:
                step.logits_rows = torch.arange(len(prompt_ids), dtype=torch.int64)
            if self.parallel is not None:
                self.parallel.send(Op.PREFILL_LOGITS, step)
            logits = self.runner.run_prompt(step)
            return logits if every_position else logits[0].float().cpu()
        finally:
            if seq.block_table:
                self.allocator.free(seq.block_table)
            self._give_back_lora_slot(seq)

    @torch.no_grad()
    def pool(
        self, prompts: list[list[int]], pooling_type: str, per_token: bool = False, loras: list | None = None
    ) -> list[torch.Tensor]:
        """The pooled final hidden states ([H], float32, on the host; engine/pooling.py), or with
        `per_token` every token's ([tokens, H]), of the first prompts: as many as one prefill step
        takes within max_num_batched_tokens, max_batch_size, the free KV blocks and, for prompts with
        an adapter (`loras`, one LoRARequest or None a prompt), the free LoRA slots. Outside the
        scheduler, between its steps, one step a call, so generation goes on between calls. Empty
        when the first prompt's blocks or adapter slot are not free now (running sequences hold them:
        call again after a step); CacheFullError when its blocks never will be."""
        from .pooling import pool

        bs = self.runner.block_size
        loras = loras if loras is not None else [None] * len(prompts)
        seqs: list[Sequence] = []
        tokens, blocks = 0, 0
        try:
            for i, (prompt, lora) in enumerate(
                zip(prompts[: self.config.max_batch_size], loras, strict=False)
            ):
                need = -(-len(prompt) // bs)
                fits = not seqs or tokens + len(prompt) <= self.config.max_num_batched_tokens
                if not fits or blocks + need > self.allocator.num_free:
                    break
                # Ids of their own: the adapter slots count their sequences by id.
                seq = Sequence(-1000 - i, list(prompt), _PROBE_PARAMS, 0, frozenset(), 1 << 30)
                if lora is not None and not self._take_lora_slot(seq, lora):
                    break
                seqs.append(seq)
                tokens, blocks = tokens + len(prompt), blocks + need
            if not seqs:
                if not self.scheduler.running:
                    raise CacheFullError(
                        f"a prompt of {len(prompts[0])} tokens needs {-(-len(prompts[0]) // bs)} KV blocks; "
                        f"{self.allocator.num_free} are free with nothing running"
                    )
                return []
            self._load_pending_adapters()
            for seq in seqs:
                seq.block_table = self.allocator.allocate(-(-len(seq.prompt_ids) // bs))
            lens = [len(seq.prompt_ids) for seq in seqs]
            batch = ScheduledBatch("prefill", seqs, [0] * len(seqs), lens, [True] * len(seqs))
            step, _ = prefill_step(batch, bs)
            if self.parallel is not None:
                self.parallel.send(Op.PREFILL_HIDDEN, step)
            hidden = self.runner.run_hidden(step)
            self.pooled_tokens += tokens
            if per_token:
                return [h.float().cpu() for h in hidden.split(lens)]
            return list(pool(hidden, lens, pooling_type).float().cpu())
        finally:
            for seq in seqs:
                if seq.block_table:
                    self.allocator.free(seq.block_table)
                self._give_back_lora_slot(seq)

    # --- the loop ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Warm up and capture graphs; with no hooks, nothing else happens at start-up."""
        with self.warmup_guard():
            self.warmup()

    def steps(self) -> Iterator[StepRecord]:
        """Run until the scheduler is empty, yielding each completed step."""
        try:
            yield from self.overlap_loop()
        except Exception:
            self.shutdown_after_error()
            raise

    def shutdown_after_error(self) -> None:
        """Shut down after a failed step; a shutdown hook that fails too is logged, not raised over the step's error."""
        try:
            self.shutdown()
        except Exception:
            log.exception("shutting down after a failed step failed as well")

    def overlap_loop(self) -> Iterator[StepRecord]:
        """Launch step n+1 before reading back step n, whenever the batch is steady."""
        inflight: InflightStep | None = None
        try:
            while True:
                nxt = self.scheduler.continue_decode(inflight.batch) if inflight is not None else None
                if nxt is None and inflight is not None and self.admits_beside:
                    nxt = self.scheduler.admit_beside(inflight.batch)
                if nxt is not None:
                    launched = self.launch(nxt, inflight)
                    done, inflight = inflight, launched
                    done.continues = launched.batch.seqs is done.batch.seqs
                    yield self.complete(done)
                    continue
                if inflight is not None:
                    done, inflight = inflight, None
                    yield self.complete(done)
                batch = self.scheduler.schedule()
                if batch is None:
                    return
                inflight = self.launch(batch, None)
        finally:
            # A consumer that stops early must not leave tokens in flight: the next run reads them.
            if inflight is not None and not self._closed:
                self.complete(inflight)

    # --- shutdown ---------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def release(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.runner.graphs = None
        if self.parallel is not None:
            self.parallel.stop_workers()
            if self.parallel.broken:
                return  # a collective whose peer is gone never finishes: do not wait for the device
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        report = self.dispatcher.shutdown(timeout=5.0)
        if not report.drained or report.not_run:
            log.warning("host dispatch shut down with work left: %s", report)

    def shutdown(self) -> None:
        self.release()


_PROBE_PARAMS = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
