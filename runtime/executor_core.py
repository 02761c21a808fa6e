"""ExecutorCore: owns the model, cache, scheduler, sampler, attention manager and streams.

It provides the step primitives (stage, prologue, forward, sample, complete). The step loop that
strings them together lives in NativeExecutor, or in a generated Executor specialised by a manifest.

Under tensor parallelism (`parallel`, see parallel/) rank 0 runs the scheduler and the loop; each
step's host inputs become a DecodeStep or PrefillStep that rank 0 broadcasts before running it, and
the workers run the same `run_decode` / `run_prefill` on their shard. With one rank nothing is sent.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator

import torch

from .attention.manager import FmhaManager
from .attention.metadata import AttentionConfig
from .engine_config import EngineConfig
from .graphs import DecodeGraphs
from .guided.decoder import GuidedDecoder
from .hooks import ALL_OFF, RuntimeHooks
from .kv_cache import BlockAllocator, KVCache, size_cache
from .parallel.collectives import SINGLE
from .parallel.messages import Op
from .parallel.sharding import local_config
from .parallel.state import ParallelState, RankFailed, check_group
from .readback import Readback
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence
from .step_runner import StepRunner
from .steps import InflightStep, StepRecord
from .weights import build_model

log = logging.getLogger("fastpath.executor")

__all__ = ["ExecutorCore", "InflightStep", "StartupError", "StepRecord"]


class StartupError(RuntimeError):
    """Start-up (warmup, graph capture, after_warmup hooks) failed; the engine is not usable."""


class ExecutorCore(StepRunner):
    def __init__(
        self, config: EngineConfig, hooks: RuntimeHooks = ALL_OFF, parallel: ParallelState | None = None
    ) -> None:
        check_group(config.tensor_parallel_size, parallel)
        self.config = config
        self.hooks = hooks
        self.parallel = parallel
        self.device = config.device
        self.dtype = config.dtype
        cfg = config.model
        self.model = build_model(
            cfg,
            config.checkpoint,
            config.dtype,
            config.device,
            config.max_seq_len,
            config.fused_kernels,
            tp=parallel.tp if parallel is not None else SINGLE,
        )
        local = local_config(cfg, self.model.part)  # this rank's heads: the KV cache and attention see these
        sizing = size_cache(
            local,
            config.dtype,
            config.device,
            config.max_batch_size,
            config.max_seq_len,
            config.block_size,
            num_blocks=config.kv_cache_blocks,
        )
        if parallel is not None:
            sizing = parallel.agree_on_cache(sizing)
        self.kv = KVCache(local, sizing, config.dtype, config.device)
        self.block_size = sizing.block_size
        self.table_width = -(-config.max_seq_len // self.block_size)
        self.allocator = BlockAllocator(sizing.num_blocks)
        self.scheduler = Scheduler(
            self.allocator, self.block_size, config.max_batch_size, config.max_num_batched_tokens
        )
        attn_cfg = AttentionConfig(
            config.device.type,
            config.dtype,
            local.num_heads,
            local.num_kv_heads,
            local.head_dim,
            local.sliding_window,
        )
        self.fmha = FmhaManager(attn_cfg, config.fmha_enabled, config.fmha_prepend)
        self.is_cuda = config.device.type == "cuda"
        self.execution_stream = torch.cuda.Stream(config.device) if self.is_cuda else None
        self.dispatcher = self._make_dispatcher()
        self.readback = Readback(self.dispatcher, config.device, parallel)
        self.guided = GuidedDecoder.for_engine(config, self.dispatcher.extension)
        # The bitmask work overlaps the forward on its own stream (why the execution-stream loop is gated off).
        self.guided_stream = (
            torch.cuda.Stream(config.device) if self.is_cuda and self.guided is not None else None
        )
        self.decode_from_embeds = self.starts_from_embeddings()
        self.graphs: DecodeGraphs | None = None
        self.in_warmup_guard = False
        self._staging_flip = 0
        self._staging: dict[tuple[int, int, int], tuple[torch.Tensor, list[tuple[int, int, int]]]] = {}
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
        mode, on_unsupported = self.config.dispatch_mode, self.config.on_unsupported
        if ext.FIXED_MODE is not None:
            if mode not in (ext.FIXED_MODE, "auto"):
                raise ValueError(
                    f"dispatch_mode={mode!r}, but {ext.__name__} is compiled for {ext.FIXED_MODE!r}"
                )
            mode = on_unsupported = None
        dispatcher = HostDispatcher(
            mode, on_unsupported, extension=ext, device="cuda" if self.is_cuda else "cpu"
        )
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
            from .parallel.worker import serve

            serve(self, until=Op.WARMUP_DONE)  # rank 0's warmup steps
        else:
            probe = Sequence(
                -1, [1] * min(8, self.config.max_seq_len - 1), _WARMUP_PARAMS, 0, frozenset(), 1 << 30
            )
            self.scheduler.add(probe)
            prefill = self.scheduler.schedule()
            self.complete(self.launch(prefill, None))
            self.complete(self.launch(self.scheduler.schedule(), None))
            self.scheduler.finish(probe)
            if self.parallel is not None:
                self.parallel.send(Op.WARMUP_DONE)
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

    def _read_back(self, batch, sampled, tokens, logprobs) -> InflightStep:
        n = len(sampled)
        host_tokens = torch.empty(n, dtype=torch.int64, pin_memory=self.is_cuda)
        host_logprobs = torch.empty(n, dtype=torch.float32, pin_memory=self.is_cuda)
        host_tokens.copy_(tokens, non_blocking=True)
        host_logprobs.copy_(logprobs, non_blocking=True)
        ticket, event = self.readback.mark()
        rows = {s.seq_id: i for i, s in enumerate(sampled)}
        return InflightStep(batch, sampled, tokens, rows, host_tokens, host_logprobs, ticket, event)

    def complete(self, step: InflightStep) -> StepRecord:
        """Wait for a step's tokens, hand them to their sequences, and retire finished sequences."""
        self.readback.wait(step.ticket, step.event)
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


_WARMUP_PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)
