"""ExecutorCore: owns the model, cache, scheduler, sampler, attention manager and streams.

It provides the step primitives (stage, prologue, forward, sample, complete). The step loop that
strings them together lives in NativeExecutor, or in a generated Executor specialised by a manifest.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .attention.manager import FmhaManager
from .attention.metadata import AttentionConfig, AttentionMetadata
from .decode_inputs import FIXED_COLUMNS, DecodeBuffers, DecodeInputs, native_prologue, stage
from .engine_config import EngineConfig
from .graphs import DecodeGraphs
from .hooks import ALL_OFF, RuntimeHooks
from .kv_cache import BlockAllocator, KVCache, size_cache
from .sampler import SamplingTensors, sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence
from .weights import build_model

log = logging.getLogger("fastpath.executor")

READBACK_TIMEOUT_S = 300.0  # a step that long is a hung device, not a slow one


class StartupError(RuntimeError):
    """Start-up (warmup, graph capture, after_warmup hooks) failed; the engine is not usable."""


@dataclass(slots=True)
class InflightStep:
    """A launched step whose sampled tokens are still on their way to the host."""

    batch: ScheduledBatch
    sampled: list[Sequence]  # in row order of `tokens`
    tokens: torch.Tensor  # device
    rows: dict[int, int]  # seq_id -> row in `tokens`, for the next step's inputs
    host_tokens: torch.Tensor
    host_logprobs: torch.Tensor
    step: int  # read-back sequence number, marked on the host by a C++ callback
    event: torch.cuda.Event | None = None  # instead, when readback_by_callback is off


@dataclass(slots=True)
class StepRecord:
    phase: str
    finished: list[Sequence] = field(default_factory=list)
    new_tokens: list[tuple[Sequence, int]] = field(default_factory=list)


class ExecutorCore:
    # Read-back completion: a C++ host callback marking a flag (no GIL), or a CUDA event.
    readback_by_callback = True

    def __init__(self, config: EngineConfig, hooks: RuntimeHooks = ALL_OFF) -> None:
        self.config = config
        self.hooks = hooks
        self.device = config.device
        self.dtype = config.dtype
        cfg = config.model
        self.model = build_model(
            cfg, config.checkpoint, config.dtype, config.device, config.max_seq_len, config.fused_kernels
        )
        sizing = size_cache(
            cfg,
            config.dtype,
            config.device,
            config.max_batch_size,
            config.max_seq_len,
            config.block_size,
            num_blocks=config.kv_cache_blocks,
        )
        self.kv = KVCache(cfg, sizing, config.dtype, config.device)
        self.block_size = sizing.block_size
        self.table_width = -(-config.max_seq_len // self.block_size)
        self.allocator = BlockAllocator(sizing.num_blocks)
        self.scheduler = Scheduler(
            self.allocator, self.block_size, config.max_batch_size, config.max_num_batched_tokens
        )
        attn_cfg = AttentionConfig(
            config.device.type,
            config.dtype,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.sliding_window,
        )
        self.fmha = FmhaManager(attn_cfg, config.fmha_enabled, config.fmha_prepend)
        self.is_cuda = config.device.type == "cuda"
        self.execution_stream = torch.cuda.Stream(config.device) if self.is_cuda else None
        self.dispatcher = self._make_dispatcher()
        # Read-back is marked by a C++ callback (no GIL) on its own stream, so the forward never waits on it.
        self._ready = self.dispatcher.token_ready_flag()
        self._readback_stream = torch.cuda.Stream(config.device) if self.is_cuda else None
        self._steps_launched = 0
        self.decode_from_embeds = self.starts_from_embeddings()
        self.guided = self._make_guided(config)
        # The bitmask work overlaps the forward on its own stream (why the execution-stream loop is gated off).
        self.guided_stream = (
            torch.cuda.Stream(config.device) if self.is_cuda and self.guided is not None else None
        )
        self.graphs: DecodeGraphs | None = None
        self.in_warmup_guard = False
        self._staging_flip = 0
        self._staging: dict[tuple[int, int, int], torch.Tensor] = {}
        self._closed = False
        self._loop_started = False
        for line in self.fmha.explain():
            log.info("fmha %s", line)

    def dispatch_extension(self) -> str:
        """The host-dispatch extension: the native binding, whose mode is chosen at run time.

        A generated executor returns its own package's extension, with the mode fixed at compile time.
        """
        return "fastpath.runtime._hostdispatch"

    def _make_dispatcher(self):
        from .hostfunc import HostDispatcher

        ext = importlib.import_module(self.dispatch_extension())
        if ext.FIXED_MODE is not None:
            if self.config.dispatch_mode not in (ext.FIXED_MODE, "auto") and self.config.dispatch_mode:
                raise ValueError(
                    f"dispatch_mode={self.config.dispatch_mode!r}, but {ext.__name__} is compiled for {ext.FIXED_MODE!r}"
                )
            mode = on_unsupported = None
        else:
            mode, on_unsupported = self.config.dispatch_mode, self.config.on_unsupported
        dispatcher = HostDispatcher(
            mode, on_unsupported, extension=ext, device="cuda" if self.is_cuda else "cpu"
        )
        log.info("host dispatch: %s backend (%s)", dispatcher.backend, dispatcher.reason)
        return dispatcher

    def _make_guided(self, config: EngineConfig):
        if config.guided_backend == "none":
            return None
        if config.guided_backend != "xgrammar":
            raise ValueError(f"guided_backend: {config.guided_backend!r} is not supported (none, xgrammar)")
        from .guided.decoder import GuidedDecoder
        from .tokenizer import resolve_tokenizer

        tokenizer = resolve_tokenizer(config.tokenizer, config.checkpoint, config.model.vocab_size)
        if tokenizer is None:
            raise ValueError("guided decoding needs the model's tokenizer, and this model has none")
        rows = (
            max(config.max_batch_size, *config.graph_batch_sizes)
            if config.graph_batch_sizes
            else config.max_batch_size
        )
        return GuidedDecoder(tokenizer, config.model.vocab_size, rows, config.device)

    def starts_from_embeddings(self) -> bool:
        """Whether decode graphs start from embeddings: true when a prologue hook does the embedding lookup."""
        return False

    # --- start-up ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def warmup_guard(self) -> Iterator[None]:
        """Errors during start-up abort it cleanly: resources are released and a StartupError names the cause."""
        self.in_warmup_guard = True
        try:
            yield
        except Exception as exc:
            self.release()
            raise StartupError(f"start-up failed: {exc}") from exc
        finally:
            self.in_warmup_guard = False

    def warmup(self) -> None:
        """Run every step kind once eagerly (kernel selection, lazy inits), then capture decode graphs."""
        probe = Sequence(
            -1, [1] * min(8, self.config.max_seq_len - 1), _WARMUP_PARAMS, 0, frozenset(), 1 << 30
        )
        self.scheduler.add(probe)
        prefill = self.scheduler.schedule()
        self.complete(self.launch(prefill, None))
        self.complete(self.launch(self.scheduler.schedule(), None))
        self.scheduler.finish(probe)
        if self.is_cuda and self.config.cuda_graphs:
            self.graphs = DecodeGraphs(self, self.config.graph_batch_sizes)
            self.graphs.capture_all()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    # --- stream order -----------------------------------------------------------------------------

    def execution_stream_scope(self) -> contextlib.AbstractContextManager:
        """Makes the execution stream current; a no-op without CUDA."""
        if self.execution_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.execution_stream)

    @contextlib.contextmanager
    def forward_order(self) -> Iterator[None]:
        """Runs the forward on the execution stream, ordered after and before the loop's stream.

        When the loop already runs on the execution stream, the cross-stream waits are skipped.
        """
        if self.execution_stream is None:
            yield
            return
        loop_stream = torch.cuda.current_stream(self.device)
        if loop_stream == self.execution_stream:
            yield
            return
        self.execution_stream.wait_stream(loop_stream)
        with torch.cuda.stream(self.execution_stream):
            yield
        loop_stream.wait_stream(self.execution_stream)

    # --- one step ---------------------------------------------------------------------------------

    def launch(self, batch: ScheduledBatch, prev: InflightStep | None) -> InflightStep:
        if batch.phase == "decode":
            tokens, logprobs, sampled = self.launch_decode(batch, prev)
        else:
            tokens, logprobs, sampled = self.launch_prefill(batch)
        for seq in sampled:
            seq.num_pending += 1
        return self._read_back(batch, sampled, tokens, logprobs)

    def launch_decode(self, batch: ScheduledBatch, prev: InflightStep | None):
        seqs = batch.seqs
        if self.guided is not None and any(s.guided is not None for s in seqs):
            kind = "guided"
        elif all(s.params.greedy for s in seqs):
            kind = "greedy"
        else:
            kind = "general"
        rows = self.graphs.bucket(len(seqs)) if self.graphs is not None else None
        if rows is not None:
            buffers = self.graphs.buffers[rows]
            width = self.table_width
        else:
            rows = len(seqs)
            width = max(-(-s.num_tokens // self.block_size) for s in seqs)
            hidden = self.model.cfg.hidden_size if self.decode_from_embeds else None
            buffers = DecodeBuffers.allocate(rows, width, hidden, self.dtype, self.device)
        packed = self._staging_buffer(rows, FIXED_COLUMNS + width)
        stage(packed, seqs, prev.rows if prev is not None else {}, self.block_size)
        inputs = DecodeInputs(len(seqs), packed, buffers, prev.tokens if prev is not None else None)
        self.decode_prologue(inputs)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
        sampling = self._sampling(seqs, rows) if kind != "greedy" else None
        if kind == "guided":
            self.guided.enqueue(list(seqs), rows)
        with self.forward_order():
            if self.graphs is not None and (rows, kind) in self.graphs.graphs:
                if sampling is not None:
                    _copy_sampling(self.graphs.sampling[rows], sampling)
                tokens, logprobs = self.graphs.replay(rows, kind)
            else:
                lens = [s.num_tokens for s in seqs]
                tokens, logprobs = self.decode_forward(
                    buffers, sampling, capturing=False, lens=lens, guided=kind == "guided"
                )
        return tokens[: len(seqs)], logprobs[: len(seqs)], seqs

    def decode_prologue(self, inputs: DecodeInputs) -> None:
        """The seam a decode_prologue hook replaces; the native executor reads its hook here."""
        self.native_decode_prologue(inputs)

    def native_decode_prologue(self, inputs: DecodeInputs) -> None:
        native_prologue(inputs, self.model.embed)

    def decode_forward(
        self,
        buffers: DecodeBuffers,
        sampling,
        capturing: bool,
        lens: list[int] | None = None,
        guided: bool = False,
    ):
        """The pure decode step: inputs in static buffers -> sampled tokens and their logprobs.

        With `guided`, the grammar work runs beside the forward on a side stream: copy the fed tokens
        to the host, a host callback fills the bitmask, copy it back; the logits wait for it.
        """
        meta = AttentionMetadata(
            "decode",
            buffers.slot_mapping,
            buffers.block_tables,
            buffers.context_lens,
            context_lens_host=lens or [],
            block_size=self.block_size,
            sliding_window=self.model.cfg.sliding_window,
            capturing=capturing,
        )
        joined = self._guided_mask_async(buffers.input_ids) if guided else None
        hidden = buffers.embeds if buffers.embeds is not None else self.model.embed(buffers.input_ids)
        logits = self.model(hidden, buffers.positions, self.kv, meta, self.fmha)
        if joined is not None:
            joined()
            logits = self.guided.apply(logits, self.guided.device_mask)
        tokens, logprobs = sample(logits, sampling, True, self.model.ops.greedy)
        return tokens, logprobs

    def _guided_mask_async(self, fed_tokens: torch.Tensor):
        """Start the bitmask work for this step; returns the join to call before the logits are masked."""
        g = self.guided
        if self.guided_stream is None:
            g.host_tokens[: fed_tokens.shape[0]].copy_(fed_tokens)
            self.host_callback(g.fill_from_device_tokens)
            g.device_mask.copy_(g.host_mask)
            return lambda: None
        main = torch.cuda.current_stream(self.device)
        self.guided_stream.wait_stream(main)
        with torch.cuda.stream(self.guided_stream):
            g.host_tokens[: fed_tokens.shape[0]].copy_(fed_tokens, non_blocking=True)
            self.host_callback(g.fill_from_device_tokens)
            g.device_mask.copy_(g.host_mask, non_blocking=True)
        return lambda: main.wait_stream(self.guided_stream)

    def host_callback(self, fn) -> None:
        """Run `fn` on the host when the current stream reaches this point (inline without CUDA)."""
        if not self.is_cuda:
            fn()
            return
        self.dispatcher.launch(fn)

    def launch_prefill(self, batch: ScheduledBatch):
        with self.forward_order():
            logits, sampled = self.prefill_logits(batch)
            if not sampled:
                empty = torch.empty(0, dtype=torch.int64, device=self.device)
                return empty, empty.float(), []
            sampling = None
            if self.guided is not None and any(s.guided is not None for s in sampled):
                self.guided.fill_on_host(sampled)
                mask = self.guided.host_mask[: len(sampled)].to(self.device, non_blocking=True)
                logits = self.guided.apply(logits, mask)
                sampling = self._sampling(sampled, len(sampled))
            elif not all(s.params.greedy for s in sampled):
                sampling = self._sampling(sampled, len(sampled))
            tokens, logprobs = sample(logits, sampling, True, self.model.ops.greedy)
        return tokens, logprobs, sampled

    def prefill_logits(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[Sequence]]:
        """Run a prefill batch; logits of the last token of each sequence that samples."""
        ids, positions, slots, tables, logits_rows, sampled = [], [], [], [], [], []
        bs = self.block_size
        ends = [start + n for start, n in zip(batch.starts, batch.lens, strict=True)]
        width = max(-(-end // bs) for end in ends)
        offset = 0
        for seq, start, n, samples in zip(batch.seqs, batch.starts, batch.lens, batch.samples, strict=True):
            ids.extend(seq.token_at(i) for i in range(start, start + n))
            positions.extend(range(start, start + n))
            slots.extend(seq.block_table[i // bs] * bs + i % bs for i in range(start, start + n))
            table = seq.block_table[:width]
            tables.append(table + [0] * (width - len(table)))
            offset += n
            if samples:
                logits_rows.append(offset - 1)
                sampled.append(seq)
            seq.num_computed = start + n
        dev = self.device
        meta = AttentionMetadata(
            "prefill",
            _to(slots, torch.int64, dev),
            _to(tables, torch.int32, dev),
            _to(ends, torch.int32, dev),
            query_lens=list(batch.lens),
            context_lens_host=ends,
            block_size=bs,
            sliding_window=self.model.cfg.sliding_window,
        )
        hidden = self.model.embed(_to(ids, torch.int64, dev))
        logits = self.model(
            hidden,
            _to(positions, torch.int64, dev),
            self.kv,
            meta,
            self.fmha,
            _to(logits_rows, torch.int64, dev),
        )
        return logits, sampled

    @torch.no_grad()
    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Next-token logits after `prompt_ids` (fp32, on the host), outside the scheduler: for oracles and tests."""
        seq = Sequence(-2, list(prompt_ids), _WARMUP_PARAMS, 0, frozenset(), 1 << 30)
        seq.block_table = self.allocator.allocate(-(-len(prompt_ids) // self.block_size))
        try:
            batch = ScheduledBatch("prefill", [seq], [0], [len(prompt_ids)], [True])
            with self.forward_order():
                logits, _ = self.prefill_logits(batch)
            return logits[0].float().cpu()
        finally:
            self.allocator.free(seq.block_table)

    def _sampling(self, seqs: list[Sequence], rows: int) -> SamplingTensors:
        pad = rows - len(seqs)
        t = SamplingTensors(
            torch.tensor([s.params.temperature for s in seqs] + [0.0] * pad, dtype=torch.float32),
            torch.tensor([s.params.top_k for s in seqs] + [0] * pad, dtype=torch.int64),
            torch.tensor([s.params.top_p for s in seqs] + [1.0] * pad, dtype=torch.float32),
            torch.tensor([s.seed for s in seqs] + [0] * pad, dtype=torch.int64),
            torch.tensor([s.num_generated for s in seqs] + [0] * pad, dtype=torch.int64),
        )
        return SamplingTensors(*(x.to(self.device, non_blocking=True) for x in _fields(t)))

    def _staging_buffer(self, rows: int, cols: int) -> torch.Tensor:
        # Two per shape: step n+1 is staged while step n's copy from the other may still be pending.
        self._staging_flip ^= 1
        key = (rows, cols, self._staging_flip)
        buf = self._staging.get(key)
        if buf is None:
            buf = torch.zeros(rows, cols, dtype=torch.int64, pin_memory=self.is_cuda)
            self._staging[key] = buf
        return buf

    def _read_back(self, batch, sampled, tokens, logprobs) -> InflightStep:
        n = len(sampled)
        host_tokens = torch.empty(n, dtype=torch.int64, pin_memory=self.is_cuda)
        host_logprobs = torch.empty(n, dtype=torch.float32, pin_memory=self.is_cuda)
        host_tokens.copy_(tokens, non_blocking=True)
        host_logprobs.copy_(logprobs, non_blocking=True)
        step = self._steps_launched
        self._steps_launched += 1
        event = None
        if self.is_cuda and not self.readback_by_callback:
            event = torch.cuda.Event()
            event.record()
        elif self._readback_stream is not None:
            self._readback_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self._readback_stream):
                self.dispatcher.launch_token_ready(self._ready, step)
        else:
            self.dispatcher.launch_token_ready(self._ready, step)
        rows = {s.seq_id: i for i, s in enumerate(sampled)}
        return InflightStep(batch, sampled, tokens, rows, host_tokens, host_logprobs, step, event)

    def complete(self, step: InflightStep) -> StepRecord:
        """Wait for a step's tokens, hand them to their sequences, and retire finished sequences."""
        if step.event is not None:
            step.event.synchronize()
        elif not self._ready.wait(step.step, READBACK_TIMEOUT_S):
            raise RuntimeError(
                f"step {step.step}'s tokens did not reach the host within {READBACK_TIMEOUT_S:.0f} s"
            )
        self.dispatcher.check()  # a host callback's exception surfaces here, with its traceback
        record = StepRecord(step.batch.phase)
        for seq, token, logprob in zip(
            step.sampled, step.host_tokens.tolist(), step.host_logprobs.tolist(), strict=True
        ):
            if seq.finished:
                continue  # it stopped one step earlier; this is the overlap loop's extra token
            seq.accept(token, logprob if seq.params.logprobs else None)
            record.new_tokens.append((seq, token))
            if seq.finish_reason is not None:
                self.scheduler.finish(seq)
                record.finished.append(seq)
        return record

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
            self.shutdown()
            raise

    def overlap_loop(self) -> Iterator[StepRecord]:
        """Launch step n+1 before reading back step n, whenever the batch is steady."""
        inflight: InflightStep | None = None
        try:
            while True:
                nxt = self.scheduler.continue_decode(inflight.batch) if inflight is not None else None
                if nxt is not None:
                    launched = self.launch(nxt, inflight)
                    done, inflight = inflight, launched
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
        self.graphs = None
        if self.is_cuda:
            torch.cuda.synchronize(self.device)
        report = self.dispatcher.shutdown(timeout=5.0)
        if not report.drained or report.not_run:
            log.warning("host dispatch shut down with work left: %s", report)

    def shutdown(self) -> None:
        self.release()


def _to(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


def _fields(t: SamplingTensors) -> tuple[torch.Tensor, ...]:
    return (t.temperature, t.top_k, t.top_p, t.seeds, t.counters)


def _copy_sampling(dst: SamplingTensors, src: SamplingTensors) -> None:
    for d, s in zip(_fields(dst), _fields(src), strict=True):
        d.copy_(s)


_WARMUP_PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)
