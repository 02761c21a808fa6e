"""ModelRunner: one step on the device, for decode and for prefill, from its payload alone.

It owns what a step uses: the model (this rank's shard), the KV cache, the attention libraries,
the decode graphs, the guided decoder, the penalty table and the streams. The executor stages
payloads and hands them to `run_decode` / `run_prefill`; tensor-parallel workers run the payloads
rank 0 broadcasts. On rank 0, `penalty_slots` is the host side of the penalty table: the engine
assigns a sequence its slot when staging its first prefill chunk (engine/steps.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fastpath.vocab import ALLREDUCE_TWO_SHOT_MAX_BYTES

from ..attention.manager import FmhaManager, NoAttentionLibrary
from ..attention.metadata import AttentionConfig, AttentionMetadata, AttentionShapes
from ..guided.decoder import GuidedDecoder
from ..model.collectives import SINGLE
from ..model.lora_table import LoRATable
from ..model.sharding import local_config
from ..model.weights import build_model
from .config import EngineConfig
from .decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, DecodeBuffers, DecodeInputs, native_prologue
from .graphs import LORA, DecodeGraphs
from .kv_cache import CacheSizing, KVCache, size_cache
from .penalties import PenaltySlots, PenaltyTable
from .prefill_graphs import PrefillGraphs, token_buckets
from .sampler import MIN_TOKENS_COLUMN, SLOTS_COLUMN, Sampled, SamplingTensors, sample
from .step_inputs import DecodeStep, PrefillStep

log = logging.getLogger("fastpath.runner")

Prologue = Callable[[DecodeInputs], None]


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        dispatcher: Any,
        *,
        parallel: Any = None,
        prologue: Prologue | None = None,
        decode_from_embeds: bool = False,
    ) -> None:
        """`parallel`: this rank's ParallelState (its `tp` context, and `agree_on_cache`), or None.

        `prologue` fills a decode step's device buffers (the executor's seam for a decode_prologue
        hook); `decode_from_embeds` says the prologue also does the embedding lookup.
        """
        self.config = config
        self.device, self.dtype = config.device, config.dtype
        self.is_cuda = config.device.type == "cuda"
        self.dispatcher = dispatcher
        self.prologue = prologue or self.native_prologue
        self.decode_from_embeds = decode_from_embeds
        self.model = build_model(
            config.model,
            config.checkpoint,
            config.dtype,
            config.device,
            config.max_seq_len,
            config.fused_kernels,
            tp=parallel.tp if parallel is not None else SINGLE,
        )
        log.info("per-token kernels: %s", self.model.ops.describe(config.device))
        if parallel is not None:  # collective, before the cache takes what memory is left
            path = parallel.tp.setup_allreduce(
                config.tp_allreduce, config.device, config.dtype, self._allreduce_bytes()
            )
            log.info("tensor-parallel all-reduce: %s", path)
        local = local_config(
            config.model, self.model.part
        )  # this rank's heads: the cache and attention see these
        # Penalty state: a slot per running sequence, plus the empty slot 0; rank 0 hands out slots.
        # Allocated before the cache is sized from the memory left.
        self.penalties = PenaltyTable(config.max_batch_size + 1, config.model.vocab_size, config.device)
        self.penalty_slots = PenaltySlots(config.max_batch_size)
        if config.max_loras:
            self.model.lora = LoRATable(
                config.model,
                self.model.part,
                config.max_loras,
                config.max_lora_rank,
                max(config.max_batch_size, config.max_num_batched_tokens, config.max_seq_len),
                config.dtype,
                config.device,
            )
        self.sizing = self._size_cache(local, parallel)
        self.kv = KVCache(local, self.sizing, config.dtype, config.device)
        self.block_size = self.sizing.block_size
        self.table_width = -(-config.max_seq_len // self.block_size)
        attn = AttentionConfig(
            config.device.type,
            config.dtype,
            local.num_heads,
            local.num_kv_heads,
            local.head_dim,
            local.sliding_window,
        )
        self.fmha = FmhaManager(attn, config.fmha_enabled, config.fmha_prepend)
        self.execution_stream = torch.cuda.Stream(config.device) if self.is_cuda else None
        self.guided = GuidedDecoder.for_engine(config, dispatcher.extension)
        # The bitmask work overlaps the forward on its own stream (why the execution-stream loop is gated off).
        self.guided_stream = (
            torch.cuda.Stream(config.device) if self.is_cuda and self.guided is not None else None
        )
        self.graphs: DecodeGraphs | None = None
        self.prefill_graphs: PrefillGraphs | None = None
        self.one_rank = parallel is None
        for line in self.fmha.explain():
            log.info("fmha %s", line)

    def _allreduce_bytes(self) -> int:
        """The largest message symmetric memory takes: a prefill chunk's hidden states, within the cap."""
        c = self.config
        rows = max(c.max_batch_size, c.max_num_batched_tokens)
        elem = torch.empty((), dtype=c.dtype).element_size()
        return min(ALLREDUCE_TWO_SHOT_MAX_BYTES, rows * c.model.hidden_size * elem)

    def _size_cache(self, local, parallel) -> CacheSizing:
        c = self.config
        sizing = size_cache(
            local,
            c.dtype,
            c.device,
            c.max_batch_size,
            c.max_seq_len,
            c.block_size,
            c.memory_fraction,
            num_blocks=c.kv_cache_blocks,
        )
        return parallel.agree_on_cache(sizing) if parallel is not None else sizing

    def capture_graphs(self) -> None:
        """Capture the decode graphs for the configured batch sizes (CUDA only)."""
        if self.is_cuda:
            self._warm_sampler()
        if self.is_cuda and self.config.cuda_graphs:
            self.graphs = DecodeGraphs(self, self.config.graph_batch_sizes)
            self.graphs.capture_all()
            self._capture_prefill_graphs()
        if self.is_cuda:
            torch.cuda.synchronize(self.device)

    def prefill_graphs_blocked(self) -> str | None:
        """Why prefill steps cannot run as graphs here (None: they can)."""
        c = self.config
        if not (self.is_cuda and c.cuda_graphs):
            return "CUDA graphs are off"
        if not self.one_rank:
            return "tensor parallelism (prefill graphs run on one rank)"
        if c.max_loras:
            return "LoRA adapters are on (enable_lora)"
        shapes = AttentionShapes("prefill", self.model.cfg.sliding_window is not None, True, True)
        try:
            lib = self.fmha.select(shapes)
        except NoAttentionLibrary as exc:
            return str(exc)
        if not lib.batched_prefill:
            return f"the prefill attention ({lib.name}) runs sequence by sequence"
        return None

    def _capture_prefill_graphs(self) -> None:
        wanted = self.config.prefill_graphs
        if wanted is False:
            return
        blocked = self.prefill_graphs_blocked()
        if blocked is not None:
            if wanted:
                raise ValueError(f"prefill_graphs=True cannot be honoured: {blocked}")
            log.info("prefill graphs off: %s", blocked)
            return
        sizes = token_buckets(self.config.max_num_batched_tokens)
        graphs = PrefillGraphs(self, sizes, self.config.max_batch_size)
        try:
            graphs.capture_all()
        except Exception as exc:
            if wanted:
                raise
            # Prefill runs eagerly as before: slower, never wrong.
            log.warning("prefill graphs off: capturing them failed: %s: %s", type(exc).__name__, exc)
            torch.cuda.synchronize(self.device)
            return
        self.prefill_graphs = graphs

    def _warm_sampler(self) -> None:
        # The general sampler's kernels compile now, with and without top-k logprobs, not at the
        # first sampled request (warmup's probe is greedy). Neutral rows change no state.
        logits = torch.zeros(1, self.config.model.vocab_size, dtype=self.dtype, device=self.device)
        for top in (False, True):
            sample(logits, SamplingTensors.neutral(1, self.device), self.model.ops, self.penalties, top)

    def graph_rows(self, num_seqs: int) -> int | None:
        """The rows of the graph that runs `num_seqs` sequences; None when no graph does."""
        return self.graphs.bucket(num_seqs) if self.graphs is not None else None

    def load_adapter(self, slot: int, weights: dict) -> None:
        """A LoRA adapter's checked weights (model/lora_adapter.py `read_weights`) into `slot`, this
        rank's slice, in stream order after the steps launched before."""
        self.model.lora.load(slot, weights)

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

    # --- decode -----------------------------------------------------------------------------------

    def run_decode(self, step: DecodeStep, prev_tokens: torch.Tensor | None) -> Sampled:
        """One decode step from its payload: prologue, then a graph replay or an eager forward."""
        rows, cols = step.packed.shape
        graphed = self.graphs is not None and rows in self.graphs.buffers
        if graphed:
            buffers = self.graphs.buffers[rows]
        else:
            hidden = self.model.cfg.hidden_size if self.decode_from_embeds else None
            buffers = DecodeBuffers.allocate(rows, cols - FIXED_COLUMNS, hidden, self.dtype, self.device)
        prev = prev_tokens if step.uses_prev else None
        # A step that bans bad words of several tokens runs eagerly: no graph is captured for it.
        words = "words_" if step.words else ""
        kind = ("guided_" if step.guided else "") + words + ("greedy" if step.sampling is None else "general")
        if step.lora is not None and self.model.lora is not None:
            kind = LORA + kind
        sampling = self._pinned(step.sampling)
        replay = graphed and (rows, kind) in self.graphs.graphs
        if replay and sampling is not None:
            # Beside the prologue's copy: queued between its unpack kernel and the graph, this copy
            # left the H200's stream idle ~15 us a step (bench/step_timeline.py). The loop's stream
            # is ordered after the last replay (forward_order), which read the buffer.
            self.graphs.sampling[rows].copy_(sampling)
        if self.model.lora is not None:
            self.model.lora.place(step.lora, rows)
        self.prologue(DecodeInputs(step.num_seqs, step.packed, buffers, prev))
        with self.forward_order():
            if replay:
                sampled = self.graphs.replay(rows, kind)
            else:
                sampling = sampling.to(self.device) if sampling is not None else None
                lens = step.packed[: step.num_seqs, CONTEXT_LEN].tolist()
                sampled = self.decode_forward(
                    buffers,
                    sampling,
                    capturing=False,
                    lens=lens,
                    guided=step.guided,
                    top=step.top_logprobs,
                    words=step.words,
                )
        return sampled.head(step.num_seqs, top=step.top_logprobs)

    def _pinned(self, sampling: SamplingTensors | None) -> SamplingTensors | None:
        """The step's parameters in pinned memory (the host allocator caches it), so their one copy
        to the device does not block the host."""
        if sampling is None or not self.is_cuda or sampling.data.is_pinned():
            return sampling
        return SamplingTensors(sampling.data.pin_memory())

    def native_prologue(self, inputs: DecodeInputs) -> None:
        # Buffers that take embeddings take this rank's share of them; decode_forward sums the shares.
        native_prologue(inputs, self.model.embed_local)

    def decode_forward(
        self,
        buffers: DecodeBuffers,
        sampling,
        capturing: bool,
        lens: list[int] | None = None,
        guided: bool = False,
        top: bool = True,
        words: bool = False,
    ):
        """The pure decode step: inputs in static buffers -> the sampled rows (with top-k logprobs
        when `top` and the general sampler runs: graphs always compute them, steps decide).

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
        if buffers.embeds is not None:
            hidden = self.model.reduce_embeds(buffers.embeds)
        else:
            hidden = self.model.embed(buffers.input_ids)
        logits = self.model(hidden, buffers.positions, self.kv, meta, self.fmha)
        ban = self._ban_words(sampling) if words else None
        if joined is not None:
            joined()
            logits, sampling = self._guided_logits(
                logits, self.guided.device_mask, self.guided.device_rows, sampling
            )
        return self._sample(logits, sampling, top, ban)

    def _ban_words(self, sampling: SamplingTensors | None):
        """Bad words of several tokens banned where their first tokens came last (runner/penalties.py),
        before the guided mask, which counts banned tokens as forbidden."""
        if sampling is None:  # a row with bad words has biases, so the general sampler
            raise RuntimeError("a step that bans bad words needs the general sampler's rows")
        slots = sampling.data[:, SLOTS_COLUMN]
        return slots, self.penalties.ban_words(slots)

    def _sample(self, logits, sampling: SamplingTensors | None, top: bool, ban=None) -> Sampled:
        sampled = sample(logits, sampling, self.model.ops, self.penalties, top)
        if ban is not None:
            slots, words = ban
            self.penalties.lift_words(words)
            self.penalties.remember(slots, sampled.tokens)
        return sampled

    def _guided_logits(self, logits, mask, rows, sampling: SamplingTensors | None):
        """The step's bitmask applied to its logits (forbidden tokens at -inf), and, for the general
        sampler, min_tokens lifted on rows whose grammar allows stop tokens only (kernels/guided_mask.py)."""
        params = None if sampling is None else sampling.data
        logits, params = self.model.ops.guided_mask(
            logits, mask, rows, params, self.penalties.entries, SLOTS_COLUMN, MIN_TOKENS_COLUMN
        )
        return logits, None if params is None else SamplingTensors(params)

    def _guided_mask_async(self, fed_tokens: torch.Tensor):
        """Start the bitmask work for this step; returns the join to call before the logits are masked."""
        g = self.guided
        if self.guided_stream is None:
            g.host_tokens[: fed_tokens.shape[0]].copy_(fed_tokens)
            g.launch_fill(self.dispatcher)
            g.device_mask.copy_(g.host_mask)
            g.device_rows.copy_(g.host_rows)
            return lambda: None
        main = torch.cuda.current_stream(self.device)
        self.guided_stream.wait_stream(main)
        with torch.cuda.stream(self.guided_stream):
            g.host_tokens[: fed_tokens.shape[0]].copy_(fed_tokens, non_blocking=True)
            g.launch_fill(self.dispatcher)
            g.device_mask.copy_(g.host_mask, non_blocking=True)
            g.device_rows.copy_(g.host_rows, non_blocking=True)
        return lambda: main.wait_stream(self.guided_stream)

    # --- prefill ----------------------------------------------------------------------------------

    def run_prefill(
        self, step: PrefillStep, guided: list | None = None, prev_tokens: torch.Tensor | None = None
    ) -> Sampled:
        """One prefill step from its payload -> the tokens of the sequences that sample.

        `guided`: the sampling sequences, when some are guided; their bitmask is filled on the host
        (every token they have is known there) and applied before sampling. `prev_tokens`: the
        device tokens of the step still in flight, where `step.pending` takes tokens from.
        """
        if step.pending is not None and prev_tokens is None:
            raise RuntimeError("a prefill step with pending tokens needs the previous step's device tokens")
        sampling = self._pinned(step.sampling)
        if self.model.lora is not None:
            self.model.lora.place(step.lora, step.ids.shape[0])
        bucket = (
            self.prefill_graphs.bucket(step)
            if self.prefill_graphs is not None and guided is None and not step.words
            else None
        )
        if bucket is not None:
            with self.forward_order():
                if step.penalty is not None:
                    self.penalties.fill(step.penalty)
                out = self.prefill_graphs.run(
                    bucket, dataclasses.replace(step, sampling=sampling), prev_tokens
                )
            return out.head(step.logits_rows.shape[0], top=step.top_logprobs)
        sampling = sampling.to(self.device) if sampling is not None else None
        with self.forward_order():
            if step.penalty is not None:
                self.penalties.fill(step.penalty)
            logits = self.prefill_forward(step, prev_tokens)
            if not step.logits_rows.numel():
                empty = torch.empty(0, dtype=torch.int64, device=self.device)
                return Sampled(empty, empty.float())
            ban = self._ban_words(sampling) if step.words else None
            if guided is not None:
                self.guided.fill_on_host(guided)
                n, g = len(guided), self.guided
                mask = g.host_mask[:n].to(self.device, non_blocking=True)
                rows = g.host_rows[:n].to(self.device, non_blocking=True)
                logits, sampling = self._guided_logits(logits, mask, rows, sampling)
            return self._sample(logits, sampling, step.top_logprobs, ban)

    def take_pending(
        self, ids: torch.Tensor, pending: torch.Tensor | None, prev: torch.Tensor | None
    ) -> None:
        """Into a step's device ids, the tokens its previous step is still sampling (in stream order
        after it): `pending` [K, 2] holds (index in ids, row of `prev`)."""
        if pending is None:
            return
        where = pending.to(self.device, non_blocking=True)
        ids.index_copy_(0, where[:, 0], prev.index_select(0, where[:, 1]))

    def run_hidden(self, step: PrefillStep) -> torch.Tensor:
        """A prefill whose final hidden states the caller wants (pooling): [T, H], every token's."""
        if self.model.lora is not None:
            self.model.lora.place(step.lora, step.ids.shape[0])
        with self.forward_order():
            return self.prefill_forward(step, hidden_only=True)

    def prefill_forward(
        self, step: PrefillStep, prev_tokens: torch.Tensor | None = None, hidden_only: bool = False
    ) -> torch.Tensor:
        """The model over a prefill step's tokens; logits of its `logits_rows` (with `hidden_only`,
        the final norm's output at every token instead)."""
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
        ids = step.ids.to(dev, non_blocking=nb)
        if step.pending is not None:
            ids = ids.clone() if ids is step.ids else ids  # never write the caller's host tensor
            self.take_pending(ids, step.pending, prev_tokens)
        hidden = self.model.embed(ids)
        if hidden_only:
            return self.model.final_hidden(
                hidden, step.positions.to(dev, non_blocking=nb), self.kv, meta, self.fmha
            )
        return self.model(
            hidden,
            step.positions.to(dev, non_blocking=nb),
            self.kv,
            meta,
            self.fmha,
            step.logits_rows.to(dev, non_blocking=nb),
        )

    def run_prompt(self, step: PrefillStep) -> torch.Tensor:
        """A prefill whose logits the caller wants: nothing is sampled."""
        if self.model.lora is not None:
            self.model.lora.place(step.lora, step.ids.shape[0])
        with self.forward_order():
            return self.prefill_forward(step)
