"""The user-facing engine: `LLM(model=...)`, `generate`, `stream`.

With `tensor_parallel_size` (or `tp`) above one, the model is sharded across that many ranks (see
parallel/). The caller is rank 0: it runs the scheduler and gets every result. The other ranks are
worker processes it spawns, or, under torchrun, the other processes, whose `LLM(...)` serves rank 0's
steps until rank 0 closes its engine and then returns an engine that produces nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from fastpath.vocab import CATALOG_MODELS

from .config import ModelConfig
from .engine_config import EngineConfig, resolve_device, resolve_dtype, resolve_graph_sizes
from .hooks import RuntimeHooks, runtime_hooks_of
from .native_executor import NativeExecutor
from .outputs import RequestError, RequestOutput, StreamToken
from .presets import RANDOM_PREFIX, resolve_random
from .sampling_params import SamplingParams
from .sequence import Sequence as Seq
from .tokenizer import generation_eos_ids, resolve_tokenizer

Prompt = str | Sequence[int]


class LLM:
    def __init__(
        self,
        model: str | Path | ModelConfig,
        *,
        device: str = "auto",
        dtype: str | None = None,
        max_batch_size: int = 16,
        max_seq_len: int | None = None,
        max_num_batched_tokens: int | None = None,
        kv_cache_blocks: int | None = None,
        cuda_graphs: bool | None = None,
        graph_batch_sizes: Sequence[int] | None = None,
        fused_kernels: bool | None = None,
        fmha_enabled: Sequence[str] | None = None,
        fmha_prepend: Sequence[str] = (),
        hooks: RuntimeHooks | None = None,
        dispatch_mode: str = "auto",
        on_unsupported: str = "warn_once",
        guided_backend: str = "none",
        seed: int = 0,
        tensor_parallel_size: int = 1,
        tp: int | None = None,  # alias of tensor_parallel_size
        tp_timeout_s: float = 300.0,  # bounds a rank's start-up and each device collective
        tokenizer: str | Path | None = None,
        executor_cls: type[NativeExecutor] = NativeExecutor,
    ) -> None:
        dev = resolve_device(device)
        torch_dtype = resolve_dtype(dtype or ("bfloat16" if dev.type == "cuda" else "float32"))
        cfg, checkpoint = _resolve_model(model, seed, torch_dtype)
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        max_seq_len = max_seq_len or min(4096, cfg.max_position_embeddings)
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {max_seq_len}")
        if tp is not None:
            if tensor_parallel_size not in (1, tp):
                raise ValueError(f"tp={tp} and tensor_parallel_size={tensor_parallel_size} disagree")
            tensor_parallel_size = tp
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        self.config = EngineConfig(
            model=cfg,
            checkpoint=checkpoint,
            tokenizer=Path(tokenizer) if tokenizer is not None else None,
            device=dev,
            dtype=torch_dtype,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            max_num_batched_tokens=max_num_batched_tokens or max(2048, max_seq_len),
            kv_cache_blocks=kv_cache_blocks,
            cuda_graphs=cuda_graphs is not False and dev.type == "cuda",
            graph_batch_sizes=resolve_graph_sizes(cuda_graphs, graph_batch_sizes, dev, max_batch_size),
            fused_kernels=fused_kernels,
            fmha_enabled=tuple(fmha_enabled) if fmha_enabled is not None else None,
            fmha_prepend=tuple(fmha_prepend),
            dispatch_mode=dispatch_mode,
            on_unsupported=on_unsupported,
            guided_backend=guided_backend,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
        )
        if hooks is None:
            hooks = runtime_hooks_of(model)
        self.tokenizer = resolve_tokenizer(self.config.tokenizer, checkpoint, cfg.vocab_size)
        self.eos_ids = frozenset(cfg.eos_token_ids) | generation_eos_ids(checkpoint)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_ids |= {self.tokenizer.eos_token_id}
        self._next_seq_id = 0
        self.parallel = None
        if tensor_parallel_size > 1:
            from .parallel.launcher import start_group

            self.parallel, self.config = start_group(self.config, hooks, executor_cls, tp_timeout_s)
        if self.parallel is None:
            self.executor = executor_cls(self.config, hooks)
        else:
            try:
                with self._peer_errors():
                    self.executor = executor_cls(self.config, hooks, parallel=self.parallel)
            except BaseException:
                self.parallel.broken = True
                self.parallel.close()
                raise
        self._finalizer = weakref.finalize(self, _close_engine, self.executor, self.parallel)
        try:
            self.executor.start()
        except BaseException:
            self._finalizer()
            raise
        if not self.is_driver:
            from .parallel.worker import serve

            try:
                serve(self.executor)
            finally:
                self._finalizer()

    @property
    def is_driver(self) -> bool:
        """Whether this process gets the results: always with one rank; rank 0 under tensor parallelism."""
        return self.parallel is None or self.parallel.is_driver

    @contextlib.contextmanager
    def _peer_errors(self) -> Iterator[None]:
        """A failure that another rank caused is raised as a WorkerLost that names the rank."""
        if self.parallel is None:
            yield
            return
        try:
            yield
        except Exception as exc:
            lost = self.parallel.explain(exc)
            if lost is exc:
                raise
            raise lost from exc

    @classmethod
    def from_manifest(cls, path: str | Path, **overrides: Any) -> LLM:
        """Run a manifest on the native engine, hooks read at run time: the generated package's twin."""
        from fastpath.compiler.resolve import resolve
        from fastpath.schema.loader import load_manifest

        return cls._from_plan(resolve(load_manifest(Path(path))), overrides)

    @classmethod
    def from_manifest_text(cls, text: str, **overrides: Any) -> LLM:
        """from_manifest for a manifest held in a string."""
        from fastpath.compiler.resolve import resolve
        from fastpath.schema.loader import parse_manifest

        return cls._from_plan(resolve(parse_manifest(text, "<manifest>")), overrides)

    @classmethod
    def _from_plan(cls, plan, overrides: dict[str, Any]) -> LLM:
        from .hooks import hooks_from_plan

        kwargs = {**plan.llm_kwargs(), **overrides}
        kwargs.setdefault("hooks", hooks_from_plan(plan.hooks_dict()))
        return cls(**kwargs)

    # --- requests ---------------------------------------------------------------------------------

    def _admit(self, prompts, sampling) -> tuple[list[RequestOutput], list[Seq], list[str]]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = (
            list(sampling)
            if isinstance(sampling, (list, tuple))
            else [sampling or SamplingParams()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} SamplingParams")
        outputs, seqs, errors = [], [], []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            ids, problem = self._encode(prompt)
            problems = ([problem] if problem else []) + p.problems()
            guided = None
            if not problems and p.guided is not None:
                guided, guided_problem = self._guided_state(p.guided)
                problems += [guided_problem] if guided_problem else []
            out = RequestOutput(i, ids or [])
            outputs.append(out)
            if problems:
                out.error, out.finish_reason = "; ".join(problems), "error"
                errors.append(f"request {i}: {out.error}")
                continue
            seq_id = self._next_seq_id
            self._next_seq_id += 1
            seed = p.seed if p.seed is not None else (self.config.seed * 1_000_003 + seq_id) & 0x7FFFFFFF
            seqs.append(
                Seq(seq_id, ids, p, seed, self.eos_ids, self.config.max_seq_len, index=i, guided=guided)
            )
        return outputs, seqs, errors

    def _guided_state(self, guided: Any):
        """(matcher state, None) or (None, the reason the constraint is refused)."""
        from .guided.grammar_cache import GrammarError
        from .guided.spec import parse_spec

        if self.executor.guided is None:
            return None, "guided decoding is off in this engine: pass guided_backend='xgrammar'"
        try:
            return self.executor.guided.state_for(parse_spec(guided)), None
        except (ValueError, GrammarError) as exc:
            return None, str(exc)

    def _encode(self, prompt: Prompt) -> tuple[list[int] | None, str | None]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                return None, "a text prompt needs a tokenizer, and this model has none: pass token ids"
            ids = list(self.tokenizer(prompt)["input_ids"])
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                return None, f"prompt must be a string or a list of token ids, got {type(prompt).__name__}"
        vocab, limit = self.config.model.vocab_size, self.config.max_seq_len
        if not ids:
            return ids, "empty prompt"
        if len(ids) >= limit:
            return ids, f"prompt of {len(ids)} tokens leaves no room to generate: max_seq_len is {limit}"
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            return ids, f"token id {bad[0]} is out of range [0, {vocab})"
        return ids, None

    def _detokenize(self, ids: list[int]) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode(ids, skip_special_tokens=True)

    def _finish(self, out: RequestOutput, seq: Seq) -> None:
        out.token_ids = list(seq.output_ids)
        out.finish_reason = seq.finish_reason
        out.text = self._detokenize(out.token_ids)
        if seq.params.logprobs:
            out.logprobs = list(seq.logprobs)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        errors: str = "raise",
    ) -> list[RequestOutput]:
        """One output per prompt. Invalid requests fail alone: the rest still run (see RequestError.outputs)."""
        if not self.is_driver:
            return []
        outputs, seqs, problems = self._admit(prompts, sampling)
        for seq in seqs:
            self.executor.scheduler.add(seq)
        with self._peer_errors():
            for _ in self.executor.steps():
                pass
        for seq in seqs:
            self._finish(outputs[seq.index], seq)
        if problems and errors == "raise":
            raise RequestError("invalid requests: " + " | ".join(problems), outputs)
        return outputs

    def stream(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> Iterator[StreamToken]:
        """Tokens as they are read back from each step. Invalid requests raise before anything runs."""
        if not self.is_driver:
            return
        outputs, seqs, problems = self._admit(prompts, sampling)
        if problems:
            raise RequestError("invalid requests: " + " | ".join(problems), outputs)
        for seq in seqs:
            self.executor.scheduler.add(seq)
        try:
            with self._peer_errors():
                for record in self.executor.steps():
                    for seq, token in record.new_tokens:
                        yield StreamToken(seq.index, token, seq.finish_reason)
        finally:
            for seq in seqs:
                if not seq.finished:
                    self.executor.scheduler.abort(seq)

    def prompt_logits(self, prompt: Prompt) -> torch.Tensor:
        """Next-token logits after one prompt (fp32, CPU). A diagnostic for comparing against an oracle."""
        if not self.is_driver:
            raise RuntimeError("prompt_logits runs on rank 0, which gets the results")
        ids, problem = self._encode(prompt)
        if problem:
            raise ValueError(problem)
        with self._peer_errors():
            return self.executor.prompt_logits(ids)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close_engine(executor: NativeExecutor, parallel) -> None:
    try:
        executor.shutdown()
    finally:
        if parallel is not None:
            parallel.close()


def _resolve_model(model: Any, seed: int, dtype: torch.dtype) -> tuple[ModelConfig, Path | None]:
    if isinstance(model, ModelConfig):
        return (model if model.random_seed is not None else model.replace(random_seed=seed)), None
    if isinstance(model, str) and model.startswith(RANDOM_PREFIX):
        return resolve_random(model, seed), None
    if isinstance(model, str) and model in CATALOG_MODELS:
        # A catalog name means the model, even where a folder of that name exists: write ./name for it.
        from .catalog import checkpoint_for

        path = checkpoint_for(model, dtype)
        return ModelConfig.from_dir(path).replace(name=model), path
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_dir():
            raise ValueError(
                f"model {str(model)!r}: not a directory (expected an HF checkpoint, 'random:<preset>' "
                f"or a catalog model: {', '.join(CATALOG_MODELS)})"
            )
        return ModelConfig.from_dir(path), path
    declared = getattr(model, "model", None)
    if declared is not None:
        return _resolve_model(declared, seed, dtype)
    raise TypeError(f"model must be a path, 'random:<preset>' or a ModelConfig, got {type(model).__name__}")
