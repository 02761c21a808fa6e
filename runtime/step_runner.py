"""StepRunner: a step's work on the device, for decode and for prefill.

`launch_*` turns a scheduled batch into host inputs (a DecodeStep or PrefillStep) and runs it;
`run_*` runs a step from those inputs alone, which is what tensor-parallel workers do with the
steps rank 0 broadcasts. ExecutorCore mixes this in and owns everything it uses.
"""

from __future__ import annotations

import torch

from .attention.metadata import AttentionMetadata
from .decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, DecodeBuffers, DecodeInputs, native_prologue, stage
from .parallel.messages import Op
from .sampler import sample
from .sampling_params import SamplingParams
from .scheduler import ScheduledBatch
from .sequence import Sequence
from .steps import DecodeStep, InflightStep, PrefillStep, prefill_step, sampling_tensors


class StepRunner:
    def launch_decode(self, batch: ScheduledBatch, prev: InflightStep | None):
        seqs = batch.seqs
        rows = self.graphs.bucket(len(seqs)) if self.graphs is not None else None
        if rows is not None:
            width = self.table_width
        else:
            rows = len(seqs)
            width = max(-(-s.num_tokens // self.block_size) for s in seqs)
        packed, owners = self._staging_buffer(rows, FIXED_COLUMNS + width)
        stage(packed, seqs, prev.rows if prev is not None else {}, self.block_size, owners)
        for seq in seqs:
            seq.num_computed = seq.num_tokens
        guided = self.guided is not None and any(s.guided is not None for s in seqs)
        greedy = all(s.params.greedy for s in seqs)
        step = DecodeStep(
            len(seqs), packed, None if greedy else sampling_tensors(seqs, rows), prev is not None, guided
        )
        if guided:
            self.guided.enqueue(list(seqs), rows)
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
        kind = ("guided_" if step.guided else "") + ("greedy" if step.sampling is None else "general")
        sampling = step.sampling.to(self.device) if step.sampling is not None else None
        with self.forward_order():
            if graphed and (rows, kind) in self.graphs.graphs:
                if sampling is not None:
                    self.graphs.sampling[rows].copy_(sampling)
                tokens, logprobs = self.graphs.replay(rows, kind)
            else:
                lens = step.packed[: step.num_seqs, CONTEXT_LEN].tolist()
                tokens, logprobs = self.decode_forward(
                    buffers, sampling, capturing=False, lens=lens, guided=step.guided
                )
        return tokens[: step.num_seqs], logprobs[: step.num_seqs]

    def decode_prologue(self, inputs: DecodeInputs) -> None:
        """The seam a decode_prologue hook replaces; the native executor reads its hook here."""
        self.native_decode_prologue(inputs)

    def native_decode_prologue(self, inputs: DecodeInputs) -> None:
        # Buffers that take embeddings take this rank's share of them; decode_forward sums the shares.
        native_prologue(inputs, self.model.embed_local)

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
        if buffers.embeds is not None:
            hidden = self.model.reduce_embeds(buffers.embeds)
        else:
            hidden = self.model.embed(buffers.input_ids)
        logits = self.model(hidden, buffers.positions, self.kv, meta, self.fmha)
        if joined is not None:
            joined()
            logits = self.guided.apply(logits, self.guided.device_mask, self.guided.device_rows)
        return sample(logits, sampling, True, self.model.ops.greedy)

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

    def launch_prefill(self, batch: ScheduledBatch):
        step, sampled = prefill_step(batch, self.block_size)
        if self.parallel is not None:
            self.parallel.send(Op.PREFILL, step)
        guided = sampled if self.guided is not None and any(s.guided is not None for s in sampled) else None
        tokens, logprobs = self.run_prefill(step, guided)
        return tokens, logprobs, sampled

    def run_prefill(self, step: PrefillStep, guided: list[Sequence] | None = None):
        """One prefill step from its host inputs -> the tokens of the sequences that sample.

        `guided`: the sampling sequences, when some are guided; their bitmask is filled on the host
        (every token they have is known there) and applied before sampling.
        """
        sampling = step.sampling.to(self.device) if step.sampling is not None else None
        with self.forward_order():
            logits = self.prefill_forward(step)
            if not step.logits_rows.numel():
                empty = torch.empty(0, dtype=torch.int64, device=self.device)
                return empty, empty.float()
            if guided is not None:
                self.guided.fill_on_host(guided)
                n, g = len(guided), self.guided
                mask = g.host_mask[:n].to(self.device, non_blocking=True)
                rows = g.host_rows[:n].to(self.device, non_blocking=True)
                logits = g.apply(logits, mask, rows)
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
        seq = Sequence(-2, list(prompt_ids), _PROBE_PARAMS, 0, frozenset(), 1 << 30)
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

    def _staging_buffer(self, rows: int, cols: int) -> tuple[torch.Tensor, list[tuple[int, int, int]]]:
        """A pinned staging buffer and the record of whose block tables its rows hold."""
        # Two per shape: step n+1 is staged while step n's copy from the other may still be pending.
        self._staging_flip ^= 1
        key = (rows, cols, self._staging_flip)
        entry = self._staging.get(key)
        if entry is None:
            entry = (torch.zeros(rows, cols, dtype=torch.int64, pin_memory=self.is_cuda), [(-1, 0, 0)] * rows)
            self._staging[key] = entry
        return entry


_PROBE_PARAMS = SamplingParams(max_tokens=2, ignore_eos=True)
