"""ExecutorCore: owns the model, cache, scheduler, sampler, attention manager and streams.

It provides the step primitives (stage, prologue, forward, sample, complete). The step loop that
strings them together lives in NativeExecutor, or in a generated Executor specialised by a manifest.

Under tensor parallelism (`parallel`, see parallel/) rank 0 runs the scheduler and the loop; each
step's host inputs become a DecodeStep or PrefillStep that rank 0 broadcasts before running it, and
the workers run the same `run_decode` / `run_prefill` on their shard. With one rank nothing is sent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from .attention.manager import FmhaManager
from .attention.metadata import AttentionConfig, AttentionMetadata
from .decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, DecodeBuffers, DecodeInputs, native_prologue, stage
from .engine_config import EngineConfig
from .graphs import DecodeGraphs
from .hooks import ALL_OFF, RuntimeHooks
from .kv_cache import BlockAllocator, KVCache, size_cache
from .parallel.collectives import SINGLE
from .parallel.messages import Op
from .parallel.sharding import local_config
from .parallel.state import ParallelState, RankFailed, check_group
from .sampler import SamplingTensors, sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch, Scheduler
from .sequence import Sequence
from .steps import DecodeStep, InflightStep, PrefillStep, StepRecord, prefill_step, sampling_tensors
from .weights import build_model

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
        # A prologue hook embeds the tokens itself, so graphs start from embeddings.
        self.decode_from_embeds = hooks.decode_prologue is not None
        self.graphs: DecodeGraphs | None = None
        self.in_warmup_guard = False
        self._staging_flip = 0
        self._staging: dict[tuple[int, int, int], torch.Tensor] = {}
        self._closed = False
        for line in self.fmha.explain():
            log.info("fmha %s", line)

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

    def launch_decode(self, batch: ScheduledBatch, prev: InflightStep | None):
        seqs = batch.seqs
        rows = self.graphs.bucket(len(seqs)) if self.graphs is not None else None
        if rows is not None:
            width = self.table_width
        else:
            rows = len(seqs)
            width = max(-(-s.num_tokens // self.block_size) for s in seqs)
        packed = self._staging_buffer(rows, FIXED_COLUMNS + width)
        stage(packed, seqs, prev.rows if prev is not None else {}, self.block_size)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
        greedy = all(s.params.greedy for s in seqs)
        step = DecodeStep(
            len(seqs), packed, None if greedy else sampling_tensors(seqs, rows), prev is not None
        )
        if self.parallel is not None:
            self.parallel.send(Op.DECODE, step)
        tokens, logprobs = self.run_decode(step, prev.tokens if prev is not None else None)
        return tokens, logprobs, seqs

    def run_decode(self, step: DecodeStep, prev_tokens: torch.Tensor | None):
        """One decode step from its host inputs: prologue, then a graph replay or an eager forward."""
        rows, cols = step.packed.shape
        graphed = self.graphs is not None and rows in self.graphs.buffers
        if graphed:
            buffers = self.graphs.buffers[rows]
        else:
            hidden = self.model.cfg.hidden_size if self.decode_from_embeds else None
            buffers = DecodeBuffers.allocate(rows, cols - FIXED_COLUMNS, hidden, self.dtype, self.device)
        prev = prev_tokens if step.uses_prev else None
        self.decode_prologue(DecodeInputs(step.num_seqs, step.packed, buffers, prev))
        kind = "greedy" if step.sampling is None else "general"
        sampling = _on(step.sampling, self.device)
        with self.forward_order():
            if graphed and (rows, kind) in self.graphs.graphs:
                if sampling is not None:
                    _copy_sampling(self.graphs.sampling[rows], sampling)
                tokens, logprobs = self.graphs.replay(rows, kind)
            else:
                lens = step.packed[: step.num_seqs, CONTEXT_LEN].tolist()
                tokens, logprobs = self.decode_forward(buffers, sampling, capturing=False, lens=lens)
        return tokens[: step.num_seqs], logprobs[: step.num_seqs]

    def decode_prologue(self, inputs: DecodeInputs) -> None:
        """The seam a decode_prologue hook replaces; the native executor reads its hook here."""
        self.native_decode_prologue(inputs)

    def native_decode_prologue(self, inputs: DecodeInputs) -> None:
        # Buffers that take embeddings take this rank's share of them; decode_forward sums the shares.
        native_prologue(inputs, self.model.embed_local)

    def decode_forward(
        self, buffers: DecodeBuffers, sampling, capturing: bool, lens: list[int] | None = None
    ):
        """The pure decode step: inputs in static buffers -> sampled tokens and their logprobs."""
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
        if buffers.embeds is not None:
            hidden = self.model.reduce_embeds(buffers.embeds)
        else:
            hidden = self.model.embed(buffers.input_ids)
        logits = self.model(hidden, buffers.positions, self.kv, meta, self.fmha)
        tokens, logprobs = sample(logits, sampling, True, self.model.ops.greedy)
        return tokens, logprobs

    def launch_prefill(self, batch: ScheduledBatch):
        step, sampled = prefill_step(batch, self.block_size)
        if self.parallel is not None:
            self.parallel.send(Op.PREFILL, step)
        tokens, logprobs = self.run_prefill(step)
        return tokens, logprobs, sampled

    def run_prefill(self, step: PrefillStep):
        """One prefill step from its host inputs -> the tokens of the sequences that sample."""
        sampling = _on(step.sampling, self.device)
        with self.forward_order():
            logits = self.prefill_forward(step)
            if not step.logits_rows.numel():
                empty = torch.empty(0, dtype=torch.int64, device=self.device)
                return empty, empty.float()
            return sample(logits, sampling, True, self.model.ops.greedy)

    def prefill_forward(self, step: PrefillStep) -> torch.Tensor:
        """The model over a prefill step's tokens; logits of its `logits_rows`."""
        dev, nb = self.device, True
        meta = AttentionMetadata(
            "prefill",
            step.slots.to(dev, non_blocking=nb),
            step.tables.to(dev, torch.int32, non_blocking=nb),
            step.ends.to(dev, torch.int32, non_blocking=nb),
            query_lens=step.query_lens.tolist(),
            context_lens_host=step.ends.tolist(),
            block_size=self.block_size,
            sliding_window=self.model.cfg.sliding_window,
        )
        hidden = self.model.embed(step.ids.to(dev, non_blocking=nb))
        return self.model(
            hidden,
            step.positions.to(dev, non_blocking=nb),
            self.kv,
            meta,
            self.fmha,
            step.logits_rows.to(dev, non_blocking=nb),
        )

    def run_prompt(self, step: PrefillStep) -> torch.Tensor:
        with self.forward_order():
            return self.prefill_forward(step)

    @torch.no_grad()
    def prompt_logits(self, prompt_ids: list[int]) -> torch.Tensor:
        """Next-token logits after `prompt_ids` (fp32, on the host), outside the scheduler: for oracles and tests."""
        seq = Sequence(-2, list(prompt_ids), _WARMUP_PARAMS, 0, frozenset(), 1 << 30)
        seq.block_table = self.allocator.allocate(-(-len(prompt_ids) // self.block_size))
        try:
            step, _ = prefill_step(
                ScheduledBatch("prefill", [seq], [0], [len(prompt_ids)], [True]), self.block_size
            )
            if self.parallel is not None:
                self.parallel.send(Op.PREFILL_LOGITS, step)
            return self.run_prompt(step)[0].float().cpu()
        finally:
            self.allocator.free(seq.block_table)

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
        event = None
        if self.is_cuda:
            event = torch.cuda.Event()
            event.record()
        rows = {s.seq_id: i for i, s in enumerate(sampled)}
        return InflightStep(batch, sampled, tokens, rows, host_tokens, host_logprobs, event)

    def complete(self, step: InflightStep) -> StepRecord:
        """Wait for a step's tokens, hand them to their sequences, and retire finished sequences."""
        if step.event is not None:
            if self.parallel is not None:
                self.parallel.wait(step.event)
            else:
                step.event.synchronize()
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

    # --- shutdown ---------------------------------------------------------------------------------

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

    def shutdown(self) -> None:
        self.release()


def _on(t: SamplingTensors | None, device: torch.device) -> SamplingTensors | None:
    if t is None:
        return None
    return SamplingTensors(*(x.to(device, non_blocking=True) for x in _fields(t)))


def _fields(t: SamplingTensors) -> tuple[torch.Tensor, ...]:
    return (t.temperature, t.top_k, t.top_p, t.seeds, t.counters)


def _copy_sampling(dst: SamplingTensors, src: SamplingTensors) -> None:
    for d, s in zip(_fields(dst), _fields(src), strict=True):
        d.copy_(s)


_WARMUP_PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)
