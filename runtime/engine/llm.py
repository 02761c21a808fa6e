"""The user-facing engine, shaped like vLLM's: `LLM(model)`, `generate`, `chat`, `stream`, `submit`.

One LLM serves any number of threads and asyncio tasks: every request joins the same continuous
batch (engine/core.py), and each caller gets exactly its own outputs.

With `tensor_parallel_size` above one, the model is sharded across that many ranks (see parallel/).
The caller is rank 0: it runs the scheduler and gets every result. The other ranks are worker
processes it spawns, or, under torchrun, the other processes, whose `LLM(...)` serves rank 0's
steps until rank 0 closes its engine and then returns an engine that produces nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import pickle
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.nn.functional as F

from fastpath.vocab import CATALOG_MODELS, RANDOM_PREFIX

from ..guided.backends import resolve_backend
from ..hooks import RuntimeHooks, runtime_hooks_of
from ..model.config import ModelConfig
from ..model.presets import resolve_random
from ..model.tokenizer import generation_eos_ids, resolve_tokenizer
from . import vllm_keywords
from .admission import (
    GuidedAdmission,
    Limits,
    Prompt,
    check_request,
    completion_seeds,
    encode,
    is_single_prompt,
    make_sequences,
)
from .beam_search import BeamSearchOutput, BeamSearchParams
from .chat_kwargs import check_template_kwargs
from .core import EngineCore, EngineStats
from .engine_view import EngineView
from .generation_defaults import generation_defaults
from .lora_admission import LoRAAdmission, per_prompt
from .native_executor import NativeExecutor
from .options import engine_config, model_dtype, parse_options
from .outputs import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    EngineClosedError,
    PoolingOutput,
    PoolingRequestOutput,
    RequestError,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from .pooling import TASKS, PoolerConfig, PoolingParams, check_pooler_config, finish, pooler_config
from .prompt_logprobs import prompt_logprobs_when_room
from .request import RequestHandle
from .sampling_params import SamplingParams
from .token_biases import token_biases
from .waiting import progress_bar, wait_all

log = logging.getLogger("fastpath.llm")

Params = SamplingParams | Sequence[SamplingParams] | None


class LLM:
    """An engine for one model. Keywords (engine/options.py): tokenizer, dtype, device, seed,
    max_seq_len (max_model_len), max_batch_size (max_num_seqs), max_num_batched_tokens,
    kv_cache_blocks, gpu_memory_utilization, cuda_graphs, enforce_eager, graph_batch_sizes,
    fused_kernels, fmha_enabled, fmha_prepend, hooks, dispatch_mode, on_unsupported, guided_backend
    ("auto": xgrammar when installed), tensor_parallel_size (tp), tp_timeout_s, executor_cls,
    enable_lora, max_loras, max_lora_rank, max_cpu_loras."""

    _sendable: SamplingParams | None = None  # the last params known to pickle for the engine process

    def __init__(self, model: str | Path | ModelConfig, **kwargs: Any) -> None:
        o = self._configure(model, kwargs)
        if o.engine_process:
            self._start_process(model, kwargs)
            return
        hooks = o.hooks if o.hooks is not None else runtime_hooks_of(model)
        self._start(hooks, o.executor_cls or NativeExecutor, o.tp_timeout_s)

    def _configure(self, model: str | Path | ModelConfig, kwargs: dict[str, Any]) -> Any:
        """The engine's configuration, tokenizer and end-of-sequence ids, from the constructor's arguments."""
        o = parse_options(kwargs)
        cfg, checkpoint = _resolve_model(model, o.seed, model_dtype(o))
        config = engine_config(cfg, checkpoint, o)
        self.tokenizer = resolve_tokenizer(config.tokenizer, checkpoint, cfg.vocab_size)
        backend, self._guided_hint = resolve_backend(
            o.guided_backend,
            has_tokenizer=self.tokenizer is not None,
            tensor_parallel_size=config.tensor_parallel_size,
        )
        self.config = dataclasses.replace(config, guided_backend=backend)
        self._lora = LoRAAdmission(cfg, self.config.max_loras, self.config.max_lora_rank)
        check_pooler_config(o.pooler_config)
        self._checkpoint, self._pooler_given, self._pooler = checkpoint, o.pooler_config, None
        self._generation_defaults = generation_defaults(o.generation_config, checkpoint)
        self._defaults = SamplingParams(**self._generation_defaults)
        self.eos_ids = frozenset(cfg.eos_token_ids) | generation_eos_ids(checkpoint)
        # The EOS that stops with no stop_reason (vLLM's: the tokenizer's, else the model's first).
        self.primary_eos = next(iter(cfg.eos_token_ids), None)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_ids |= {self.tokenizer.eos_token_id}
            self.primary_eos = self.tokenizer.eos_token_id
        return o

    def _start(self, hooks: RuntimeHooks, executor_cls: type, tp_timeout_s: float) -> None:
        self.recipe = None  # only an engine in its own process has one (for API servers to attach to)
        self.parallel = None
        self.core: EngineCore | None = None
        if self.config.tensor_parallel_size > 1:
            from ..parallel.launcher import start_group

            self.parallel, self.config = start_group(self.config, hooks, executor_cls, tp_timeout_s)
        try:
            with self._peer_errors():
                self.executor = executor_cls(self.config, hooks, parallel=self.parallel)
        except BaseException:
            if self.parallel is not None:
                self.parallel.broken = True
                self.parallel.close()
            raise
        self._finalizer = weakref.finalize(self, _close_engine, None, self.executor, self.parallel)
        _engines.add(self)
        try:
            self.executor.start()
        except BaseException:
            self._finalizer()
            raise
        if not self.is_driver:
            from ..parallel.worker import serve

            try:
                serve(self.executor.runner, self.parallel.channel)
            finally:
                self._finalizer()
            return
        # Not a bound method of self: the loop thread must not keep this LLM alive, or it is never closed.
        self.core = EngineCore(self.executor, functools.partial(peer_errors, self.parallel))
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _close_engine, self.core, self.executor, self.parallel)
        _engines.add(self)
        runner = self.executor.runner
        self._limits = Limits(
            self.config.model.vocab_size,
            self.config.max_seq_len,
            (self.executor.allocator.num_blocks - 1) * runner.block_size,
        )
        self._guided = GuidedAdmission(runner.guided, self._guided_hint)
        self._ids = itertools.count()
        self._requests = itertools.count()

    def _start_process(self, model: Any, kwargs: dict[str, Any]) -> None:
        """The engine in a process of its own, built there from the same arguments (core_process.py)."""
        from .core_client import start_engine_process
        from .core_process import Recipe

        self.parallel = None
        self.executor = None
        self.core = None
        recipe = Recipe(type(self), model, {**kwargs, "engine_process": False}, logging.getLogger().level)
        try:
            pickle.dumps(recipe)
        except Exception as exc:
            raise TypeError(
                "engine_process=True sends the engine's arguments to a new process, and one of them "
                f"cannot be sent ({type(exc).__name__}: {exc}); hooks and executor classes must be "
                "importable by name"
            ) from None
        client = start_engine_process(recipe)
        self.recipe = recipe
        self._use_engine_process(client, first_id=0)

    def _use_engine_process(self, client: Any, first_id: int) -> None:
        self.parallel = None
        self.executor = None
        self.core = client
        self.config = client.info["config"]
        self._limits = client.info["limits"]
        self._guided = None
        self._ids = itertools.count(first_id)
        self._requests = itertools.count()
        self._finalizer = weakref.finalize(self, client.close)
        _engines.add(self)

    @classmethod
    def attach(cls, recipe: Any, conn: Any, info: dict[str, Any], index: int) -> LLM:
        """An LLM over an engine process that another LLM started, in another process (an API server of
        `fastpath serve --api-server-count N`): `recipe` is that LLM's `recipe`, `conn` and `info` what
        its `open_link()` gave, and `index` (1, 2, ...) keeps this client's sequence ids apart from
        every other's. Closing it ends only its own requests."""
        from .core_client import EngineCoreClient

        if not isinstance(index, int) or isinstance(index, bool) or not 1 <= index < 1 << 20:
            raise ValueError(f"index must be an int in [1, 2**20), got {index!r}")
        self = cls.__new__(cls)
        self._configure(recipe.model, recipe.kwargs)
        self.recipe = recipe
        self._use_engine_process(
            EngineCoreClient(conn, None, info, owner=False), first_id=index << LINK_SHIFT
        )
        return self

    @classmethod
    def from_lock(cls, lock: Mapping[str, Any], **overrides: Any) -> LLM:
        """The engine a resolved manifest describes: `lock` is a manifest.lock.json's content.

        Hooks are imported from their paths at run time (a generated package compiles them in
        instead); keyword arguments override the lock's engine arguments.
        """
        from ..hooks import hooks_from_lock

        kwargs = {**lock["llm_kwargs"], **overrides}
        kwargs.setdefault("hooks", hooks_from_lock(lock.get("hooks", {})))
        return cls(**kwargs)

    @property
    def is_driver(self) -> bool:
        """Whether this process gets the results: always with one rank; rank 0 under tensor parallelism."""
        return self.parallel is None or self.parallel.is_driver

    def _peer_errors(self) -> contextlib.AbstractContextManager:
        return peer_errors(self.parallel)

    @property
    def llm_engine(self) -> EngineView:
        """vLLM's `llm.llm_engine`, as far as ported scripts read it: get_tokenizer() and model_config."""
        return EngineView(self)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """The model's own sampling values (SamplingParams keywords from its generation_config.json),
        only those it sets: what a server fills in for fields a request leaves unset."""
        return dict(self._generation_defaults)

    def get_default_sampling_params(self) -> SamplingParams:
        """What a request without SamplingParams gets: the model's generation_config.json values
        (temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens) over SamplingParams'
        own defaults, unless the LLM was made with generation_config="vllm"."""
        return self._defaults

    def open_link(self) -> tuple[Any, dict[str, Any]]:
        """(a pipe into this LLM's engine process, the engine's description): what `LLM.attach` takes
        in another process, with this LLM's `recipe`. The caller hands the pipe on, then closes its copy."""
        if self.recipe is None or self.executor is not None or not getattr(self.core, "owner", False):
            raise RuntimeError(
                "links go into an engine process this LLM started: LLM(..., engine_process=True)"
            )
        return self.core.open_link(), self.core.info

    # --- requests ---------------------------------------------------------------------------------

    def submit(
        self,
        prompt: Prompt,
        sampling_params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
        stream: bool = True,
        wake: threading.Event | None = None,
        lora_request: Any = None,
    ) -> RequestHandle:
        """Admit one request into the running batch and return its handle; ValueError if it is invalid.

        From any thread; pass `loop` to iterate the handle with `async for` on that event loop.
        `stream=False` reports only the finish (cheaper for the engine's loop). `lora_request`: the
        LoRARequest it runs with (enable_lora=True).
        """
        handle = self._admit(prompt, sampling_params, request_id, loop, stream, wake, lora_request)
        self.core.submit([handle])
        return handle

    def check_lora(self, lora_request: Any) -> Any:
        """`lora_request` checked as a request's is (LoRA on, its folder an adapter this model can
        run); returned as is. ValueError or TypeError naming what is wrong."""
        return self._lora.check(lora_request)

    def lora_id_for(self, path: str, fresh: bool = False) -> int:
        """A lora_int_id for the adapter at `path`: the one it was admitted under, else (or with
        `fresh`, for a folder whose files may have changed) one no adapter has yet."""
        return self._lora.fresh_id() if fresh else self._lora.id_for(path)

    def _admit(self, prompt, sampling_params, request_id, loop, stream, wake, lora=None) -> RequestHandle:
        """A request checked and made into its sequences, not yet submitted."""
        if self.core is None:
            raise RuntimeError("requests go to rank 0, which gets the results")
        if loop is not None and not isinstance(loop, asyncio.AbstractEventLoop):
            # Checked here: the engine's thread calls into it at every step.
            raise TypeError(f"loop must be an asyncio event loop, got {type(loop).__name__}")
        params = sampling_params if sampling_params is not None else self._defaults
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if self.executor is None and params is not self._sendable:
            try:  # here, on the caller's thread: the pipe's sender would drop it and the request wait
                pickle.dumps(params)
            except Exception as exc:
                raise ValueError(
                    f"sampling_params cannot be sent to the engine process: {type(exc).__name__}: {exc}"
                ) from None
            self._sendable = params
        lora = self._lora.check(lora)
        admitted = encode(prompt, self.tokenizer, self._limits, params.truncate_prompt_tokens)
        check_request(admitted.prompt_ids, params, self._limits)
        biases = token_biases(params, self.tokenizer, self._limits.vocab_size, self.eos_ids)
        rid = request_id if request_id is not None else str(next(self._requests))
        handle = RequestHandle(
            rid,
            admitted.prompt,
            admitted.prompt_ids,
            params,
            self.tokenizer,
            self.core.abort,
            loop=loop,
            wake=wake,
        )
        guided = self._prepare(handle, admitted.prompt_ids, params, lora)
        seq_ids = [next(self._ids) for _ in range(params.n)]
        derived = _derived_seed(self.config.seed, seq_ids[0])
        seqs = make_sequences(
            seq_ids,
            admitted,
            params,
            completion_seeds(params, derived),
            self._limits,
            guided,
            self.eos_ids,
            self.primary_eos,
            biases,
        )
        for seq in seqs:
            handle.attach(seq)
            seq.streams = stream or bool(params.stop)
            seq.lora = lora
        return handle

    def _prepare(
        self, handle: RequestHandle, prompt_ids: list[int], params: SamplingParams, lora: Any = None
    ) -> list[Any]:
        """What a request needs from the engine before it joins: its constraint's matcher states (one
        per completion) and its prompt logprobs (under its adapter, `lora`). An engine process keeps
        the states itself."""
        guided: list[Any] = [None] * params.n
        if params.guided is None and params.prompt_logprobs is None:
            return guided
        if self.executor is None:  # the engine runs in its own process
            handle.engine_token, handle.prompt_logprobs = self.core.prepare(prompt_ids, params, lora)
            return guided
        if params.guided is not None:
            guided = [self._guided_state(params.guided, prompt_ids) for _ in range(params.n)]
        if params.prompt_logprobs is not None:
            handle.prompt_logprobs = prompt_logprobs_when_room(
                self.core,
                self.executor,
                prompt_ids,
                params.prompt_logprobs,
                _detokenizer(self.tokenizer, params),
                lora,
            )
        return guided

    def _guided_state(self, guided: Any, prompt_ids: list[int] | None = None) -> Any:
        try:
            return self._guided.state(guided, prompt_ids, self.tokenizer)
        except ValueError:
            raise
        except Exception as exc:  # a constraint a backend chokes on fails its request alone
            raise ValueError(f"guided: {type(exc).__name__}: {exc}") from exc

    @property
    def executor_name(self) -> str:
        """The executor class's qualified name (in the engine process, when there is one)."""
        if self.executor is None and self.core is not None:
            return self.core.info["executor"]
        cls = type(self.executor)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def in_engine_process(self) -> bool:
        """Whether the engine runs in a process of its own (engine_process=True, or attached)."""
        return self.executor is None and self.core is not None

    @property
    def closed_reason(self) -> str | None:
        """Why the engine no longer takes requests (closed, failed, its process gone); None while it does."""
        return getattr(self.core, "closed_reason", None)

    @property
    def engine_pid(self) -> int | None:
        """The engine process's pid; None when the engine runs in this process."""
        if self.executor is None and self.core is not None:
            return self.core.info.get("pid")
        return None

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: Params = None,
        *,
        use_tqdm: bool | Callable[..., Any] = True,
        errors: str = "raise",
        lora_request: Any = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """One output per prompt, in order. An invalid request fails alone: the rest still run, and a
        RequestError at the end carries every output (errors="return" hands them back instead).

        - `prompts`: one prompt or a list of them. A prompt is a string, a list of token ids, or a
          dict with 'prompt' (text) and/or 'prompt_token_ids' (when both, the ids are used). A dict's
          'cache_salt' (vLLM's) keys the prefix cache: a prompt finds cached blocks only of prompts
          with the same salt, so tenants cannot probe each other's prompts by timing.
        - `sampling_params`: one SamplingParams for every prompt, or a list with one per prompt;
          None: `get_default_sampling_params()`.
        - `use_tqdm`: True shows a tqdm bar of the prompts processed on stderr (as vLLM, terminal or
          not; FASTPATH_PROGRESS=0 hides it); a callable is the tqdm class or factory to use, called
          with vLLM's keywords (total, desc, dynamic_ncols); False shows none.
        - `errors`: "raise" (a RequestError after the rest have run) or "return" (the failed
          requests' outputs carry their `error`).
        - `lora_request`: a LoRARequest for every prompt, or a list with one (or None) per prompt;
          the engine needs enable_lora=True. A bad adapter fails its requests alone.
        - `priority`: vLLM's, accepted at None (and priorities of 0): requests are scheduled first
          come, first served."""
        vllm_keywords.check_call(priority=priority)
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
        if self.core is None:
            return []
        prompts = _prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self._defaults)
        loras = per_prompt(lora_request, len(prompts))
        outputs, handles, problems, wake = self._submit_all(prompts, params, stream=False, loras=loras)
        try:
            wait_all(list(handles.values()), wake, use_tqdm)
        except BaseException:  # Ctrl-C, a timeout: what this call started stops with it
            for h in handles.values():
                h.abort()
            with contextlib.suppress(Exception):
                self.core.call(lambda: None)  # the aborts are done when generate() raises
            raise
        self._raise_if_failed(handles.values())
        for i, h in handles.items():
            outputs[i] = h.result()
            if h.rejected:  # the engine would not take it: it failed alone, as an invalid one does
                problems.append(f"request {i}: {h.error}")
        if problems and errors == "raise":
            raise RequestError("invalid requests: " + " | ".join(problems), outputs)
        return outputs

    def _submit_all(
        self, prompts: list, params: list[SamplingParams], stream: bool, loras: list | None = None
    ):
        wake = threading.Event()
        outputs: list[RequestOutput | None] = [None] * len(prompts)
        handles: dict[int, RequestHandle] = {}
        problems = []
        loras = loras if loras is not None else [None] * len(prompts)
        for i, (prompt, p, lora) in enumerate(zip(prompts, params, loras, strict=True)):
            try:
                handles[i] = self._admit(prompt, p, None, None, stream, wake, lora)
            except (ValueError, TypeError) as exc:
                outputs[i] = _failed(str(next(self._requests)), prompt, str(exc))
                problems.append(f"request {i}: {exc}")
        if handles and not (problems and stream):
            self.core.submit(list(handles.values()))
        elif self.executor is None and self.core is not None:
            self.core.forget([h.engine_token for h in handles.values() if h.engine_token is not None])
        return outputs, handles, problems, wake

    def _raise_if_failed(self, handles) -> None:
        """Only the engine's end fails an admitted request: raise what ended it."""
        failed = next((h.error for h in handles if h.error is not None and not h.rejected), None)
        if failed is not None:
            raise self.core.failure or EngineClosedError(failed)

    def stream(
        self, prompts: Prompt | Sequence[Prompt], sampling_params: Params = None, lora_request: Any = None
    ) -> Iterator[RequestOutput]:
        """Incremental outputs as steps complete: each holds the new token ids and the new text of one
        request. Invalid requests raise before anything runs; closing the iterator aborts the rest.

        - `prompts`: one prompt or a list of them, as in generate(); an output's `request_id` says
          which request it belongs to.
        - `sampling_params`: one SamplingParams for every prompt, or a list with one per prompt;
          None: `get_default_sampling_params()`.
        - `lora_request`: as in generate()."""
        if self.core is None:
            return
        prompts = _prompt_list(prompts)
        params = _params_per_prompt(sampling_params, len(prompts), self._defaults)
        loras = per_prompt(lora_request, len(prompts))
        outputs, handles, problems, wake = self._submit_all(prompts, params, stream=True, loras=loras)
        if problems:
            raise RequestError("invalid requests: " + " | ".join(problems), [o for o in outputs if o])
        try:
            pending = dict(handles)
            while pending:
                for i, h in list(pending.items()):
                    for out in h.deltas():
                        if h.rejected:  # the engine would not take it (its adapter): as an invalid one
                            raise RequestError(f"invalid requests: request {i}: {h.error}", [out])
                        yield out
                    self._raise_if_failed([h])
                    if h.finished:
                        del pending[i]
                if pending:
                    wake.wait()
                    wake.clear()
        finally:
            for h in handles.values():
                h.abort()
            with contextlib.suppress(RuntimeError):
                self.core.call(lambda: None)  # the aborts are done when the stream is closed

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: Params = None,
        *,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: Any = None,
        chat_template_content_format: str = "auto",
        mm_processor_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to conversations, each rendered by the tokenizer's chat template (or
        `chat_template`) straight to token ids, so the template's BOS is the only one. A conversation
        the template refuses fails alone, as an invalid prompt does (a RequestError at the end).

        - `messages`: one conversation (a list of {'role', 'content'} dicts; OpenAI-style text content
          parts are joined) or a list of conversations.
        - `sampling_params`: one SamplingParams for every conversation, or a list with one per
          conversation; None: `get_default_sampling_params()`.
        - `chat_template`: a Jinja template to use instead of the tokenizer's.
        - `add_generation_prompt`: end the rendering with the template's assistant turn opening, so
          the model writes a reply.
        - `continue_final_message`: leave the last message open, so the model continues it (for a
          final assistant message; use with add_generation_prompt=False).
        - `chat_template_kwargs`: extra variables for the template (e.g. enable_thinking).
        - `tools`: tool (function) definitions, passed to the template as `tools`.
        - `use_tqdm`: as in generate().
        - `lora_request`: as in generate(), one per conversation or one for all.
        - `chat_template_content_format` ('auto' or 'string'), `mm_processor_kwargs`: vLLM's, accepted
          where they ask for what fastpath does (text parts joined)."""
        vllm_keywords.check_call(
            chat_template_content_format=chat_template_content_format,
            mm_processor_kwargs=mm_processor_kwargs,
        )
        conversations = _conversations(messages)
        params = _params_per_prompt(sampling_params, len(conversations), self._defaults)
        loras = per_prompt(lora_request, len(conversations))
        # What is wrong with the call itself fails the call, not each conversation.
        self._chat_tokenizer(chat_template)
        check_template_kwargs(chat_template_kwargs)
        prompts: list[Any] = []
        failed: dict[int, RequestOutput] = {}
        for i, c in enumerate(conversations):
            try:
                prompts.append(
                    self.render_chat(
                        c,
                        chat_template,
                        add_generation_prompt,
                        continue_final_message,
                        chat_template_kwargs,
                        tools,
                    )
                )
            except Exception as exc:  # the template's own error (raise_exception, a bad role order)
                failed[i] = _failed(str(next(self._requests)), None, f"{type(exc).__name__}: {exc}")
        if not failed:
            return self.generate(prompts, params, use_tqdm=use_tqdm, lora_request=loras)
        good = [i for i in range(len(conversations)) if i not in failed]
        ran = iter(
            self.generate(
                prompts,
                [params[i] for i in good],
                use_tqdm=use_tqdm,
                errors="return",
                lora_request=[loras[i] for i in good],
            )
        )
        merged = [failed[i] if i in failed else next(ran) for i in range(len(conversations))]
        problems = [f"conversation {i}: {o.error}" for i, o in enumerate(merged) if o.error is not None]
        raise RequestError("invalid requests: " + " | ".join(problems), merged)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """A conversation as a prompt dict {'prompt': text, 'prompt_token_ids': ids}. OpenAI-style
        content parts of type text are joined into the message's text first."""
        tok = self._chat_tokenizer(chat_template)
        check_template_kwargs(chat_template_kwargs)
        kwargs = dict(
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **(chat_template_kwargs or {}),
        )
        if tools is not None:
            kwargs["tools"] = list(tools)
        messages = [flat_message(m) for m in messages]
        text = tok.apply_chat_template(messages, tokenize=False, **kwargs)
        # What apply_chat_template(tokenize=True) does after rendering, without rendering again: the
        # template already wrote the special tokens it wants.
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return {"prompt": text, "prompt_token_ids": list(ids)}

    def _chat_tokenizer(self, chat_template: str | None) -> Any:
        tok = self.tokenizer
        if tok is None:
            raise ValueError("chat needs a tokenizer, and this model has none")
        if chat_template is None and getattr(tok, "chat_template", None) is None:
            raise ValueError("this tokenizer has no chat template: pass chat_template=")
        return tok

    def stats(self) -> EngineStats:
        """Requests running and waiting, KV-cache blocks, token counts: for metrics."""
        if self.core is None:
            raise RuntimeError("stats are kept on rank 0")
        return self.core.stats()

    def reset_prefix_cache(self) -> bool:
        """Forget every block the prefix cache holds (vLLM's, for benchmarks that must start cold);
        False when the engine was built without enable_prefix_caching."""
        if self.core is None:
            raise RuntimeError("the prefix cache is kept on rank 0")
        return self.core.reset_prefix_cache()

    # vLLM's pooling and beam-search entry points, so code written for them fails saying why.
    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: Any = None,
    ) -> list[EmbeddingRequestOutput]:
        """vLLM's: one embedding per prompt, pooled from the final norm's output of its prefill as
        the model's pooler config says (engine/pooling.py: the checkpoint's sentence-transformers
        config, else the last token, L2-normalized; LLM's pooler_config overrides).

        - `pooling_params`: one PoolingParams for every prompt, or one per prompt (`dimensions`,
          `normalize`, `truncate_prompt_tokens`).
        - `truncate_prompt_tokens`: as PoolingParams', for every prompt.
        - `use_tqdm`: a bar over the prompts, as generate()'s.
        - `lora_request`: one LoRARequest for every prompt, or one (or None) per prompt: the prompt
          is pooled from the model with that adapter."""
        pooled = self._pool(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request, "embed")
        return [
            EmbeddingRequestOutput(rid, EmbeddingOutput(vector.tolist()), ids) for rid, ids, vector in pooled
        ]

    def encode(
        self,
        prompts: Prompt | Sequence[Prompt],
        pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        lora_request: Any = None,
        pooling_task: str | None = None,
    ) -> list[PoolingRequestOutput]:
        """vLLM's: each prompt's pooled data as a tensor. `pooling_task`: "embed" (None: the same),
        one vector as embed() gives; "token_embed", every token's final hidden state, each
        normalized when the pooler config (or `normalize`) says. Other tasks (classify, score,
        reward) need heads fastpath does not have: ValueError."""
        task = pooling_task or "embed"
        if task not in TASKS:
            raise ValueError(
                f"pooling_task {pooling_task!r} is not supported; fastpath pools {' or '.join(TASKS)}"
            )
        pooled = self._pool(prompts, pooling_params, truncate_prompt_tokens, use_tqdm, lora_request, task)
        return [PoolingRequestOutput(rid, PoolingOutput(data), ids) for rid, ids, data in pooled]

    def _pool(self, prompts, pooling_params, truncate, use_tqdm, lora_request, task: str) -> list[tuple]:
        """(request id, prompt ids, float32 tensor) per prompt; a bad prompt or parameter raises
        before anything runs. One prefill step a call into the engine, so generation goes on
        between them; prompts whose KV blocks running sequences hold wait for them."""
        if self.core is None:
            return []
        if truncate is not None:
            PoolingParams(truncate_prompt_tokens=truncate)  # checked as the field is
        prompts = _prompt_list(prompts)
        params = _pooling_per_prompt(pooling_params, len(prompts))
        loras = [self._lora.check(lora) for lora in per_prompt(lora_request, len(prompts))]
        config = self.pooler_config()
        hidden = self.config.model.hidden_size
        ids = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            cut = truncate if truncate is not None else p.truncate_prompt_tokens
            try:
                if p.dimensions is not None and p.dimensions > hidden:
                    raise ValueError(f"dimensions {p.dimensions} is more than the model's {hidden}")
                prompt_ids = encode(prompt, self.tokenizer, self._limits, cut, room=0).prompt_ids
                if len(prompt_ids) > self._limits.cache_tokens:
                    raise ValueError(
                        f"{len(prompt_ids)} prompt tokens need more KV cache than the engine holds for one "
                        f"sequence ({self._limits.cache_tokens})"
                    )
            except ValueError as e:
                raise ValueError(f"{task} prompt {i}: {e}") from None
            ids.append(prompt_ids)
        out: list[tuple] = []
        bar = progress_bar(use_tqdm, len(ids), "Processed prompts")
        try:
            while len(out) < len(ids):
                done = len(out)
                pooled = self._pooled(ids[done:], config.pooling_type, task == "token_embed", loras[done:])
                for prompt_ids, p, data in zip(ids[done:], params[done:], pooled, strict=False):
                    normalize = config.normalize if p.normalize is None else p.normalize
                    out.append((str(next(self._requests)), prompt_ids, finish(data, normalize, p.dimensions)))
                if bar is not None and pooled:
                    bar.update(len(pooled))
        finally:
            if bar is not None:
                bar.close()
        return out

    def pooler_config(self) -> PoolerConfig:
        """How embed() and encode() pool (engine/pooling.py): LLM's pooler_config over the
        checkpoint's sentence-transformers config over vLLM's default; read at the first call, so a
        checkpoint whose config cannot be used still generates."""
        if self._pooler is None:
            self._pooler = pooler_config(self._checkpoint, self._pooler_given)
        return self._pooler

    def _pooled(
        self, ids: list[list[int]], pooling_type: str, per_token: bool, loras: list
    ) -> list[torch.Tensor]:
        """What one prefill step pools of the first prompts (engine/executor.py `pool`)."""
        if self.executor is None:  # the engine runs in its own process
            return self.core.pool(ids, pooling_type, per_token, loras)
        return self.core.call(lambda: self.executor.pool(ids, pooling_type, per_token, loras))

    def classify(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_NOT_HERE.format("classify"))

    def score(
        self,
        data_1: Prompt | Sequence[Prompt],
        data_2: Prompt | Sequence[Prompt],
        /,
        *,
        truncate_prompt_tokens: int | None = None,
        use_tqdm: bool | Callable[..., Any] = True,
        pooling_params: PoolingParams | None = None,
        lora_request: Any = None,
    ) -> list[ScoringRequestOutput]:
        """vLLM's, as it scores with an embedding model: the cosine similarity of each pair's
        embeddings (embed()'s). One `data_1` is scored against each of `data_2`; two lists of one
        length are scored pair by pair."""
        ones, twos = _prompt_list(data_1), _prompt_list(data_2)
        if isinstance(lora_request, list | tuple):
            raise ValueError("score takes one lora_request (or None) for every text, not a list")
        if len(ones) != 1 and len(ones) != len(twos):
            raise ValueError(f"score takes one data_1 or as many as data_2: got {len(ones)} and {len(twos)}")
        if not twos:
            return []
        # One data_1 is embedded once, not once a pair.
        outs = self.embed(ones + twos, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                          use_tqdm=use_tqdm, lora_request=lora_request)  # fmt: skip
        n = len(ones)
        firsts = outs[:n] * len(twos) if n == 1 else outs[:n]
        scored = []
        for a, b in zip(firsts, outs[n:], strict=True):
            cosine = F.cosine_similarity(
                torch.tensor(a.outputs.embedding), torch.tensor(b.outputs.embedding), dim=0
            )
            scored.append(
                ScoringRequestOutput(
                    b.request_id, ScoringOutput(float(cosine)), a.prompt_token_ids + b.prompt_token_ids
                )
            )
        return scored

    def reward(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(_NOT_HERE.format("reward"))

    def beam_search(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: BeamSearchParams,
        lora_request: Any = None,
        use_tqdm: bool | Callable[..., Any] = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """vLLM's beam search (engine/beam_search.py): for each prompt, its `params.beam_width` best
        sequences, best first. Each step runs every live beam as a one-token request with its top
        2 * beam_width logprobs, so build the engine with `enable_prefix_caching=True`, or every step
        prefills every beam again. `concurrency_limit` searches that many prompts at a time."""
        from . import beam_search as search

        search.check_request(params, concurrency_limit)
        if self.core is None:
            return []
        ids, salts = [], []
        prompts = _prompt_list(prompts)
        loras = per_prompt(lora_request, len(prompts))
        for i, (prompt, lora) in enumerate(zip(prompts, loras, strict=True)):
            try:
                admitted = encode(prompt, self.tokenizer, self._limits)
                prompt_ids = admitted.prompt_ids
                check_request(prompt_ids, SamplingParams(max_tokens=params.max_tokens), self._limits)
                self._lora.check(lora)
                if len(prompt_ids) + params.max_tokens > self._limits.max_seq_len:
                    raise ValueError(
                        f"{len(prompt_ids)} prompt tokens and max_tokens={params.max_tokens} exceed "
                        f"max_seq_len (max_model_len) {self._limits.max_seq_len}"
                    )
            except ValueError as e:
                raise ValueError(f"beam_search prompt {i}: {e}") from None
            ids.append(prompt_ids)
            salts.append(admitted.cache_salt)
        if not self.config.enable_prefix_caching and params.max_tokens > 1:
            log.info("beam_search prefills every beam again each step: enable_prefix_caching=True finds them")
        return search.beam_search(self, ids, params, use_tqdm, concurrency_limit, loras, salts)

    def prompt_logits(self, prompt: Prompt):
        """Next-token logits after one prompt (fp32, CPU). A diagnostic for comparing against an oracle."""
        if self.core is None:
            raise RuntimeError("prompt_logits runs on rank 0, which gets the results")
        ids = encode(prompt, self.tokenizer, self._limits).prompt_ids
        return self.core.call(lambda: self.executor.prompt_logits(ids))

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_engines: weakref.WeakSet[LLM] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child, an LLM of the parent's is closed: its loop (or reader) thread did not come
    along, so a call would wait forever, and its exit must not close what the parent still runs."""
    for llm in list(_engines):
        llm._finalizer.detach()
        if llm.core is not None:
            llm.core.forked()


os.register_at_fork(after_in_child=_after_fork_in_child)

LINK_SHIFT = 40  # an attached client's sequence ids start at index << LINK_SHIFT


_MASK64 = (1 << 64) - 1


def _derived_seed(seed: int, seq_id: int) -> int:
    """An unseeded request's seed: the engine seed and the sequence id mixed (splitmix64's finalizer),
    so it is reproducible for a given engine seed, yet is not the small number a user would pass as
    `seed` (the request with id 7 sampled what `seed=7` does), and an attached client's index (the
    id's high bits) gives each API server's requests seeds of their own."""
    x = (seed * 0x9E3779B97F4A7C15 + seq_id + 1) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 31)) & 0x7FFFFFFF


@contextlib.contextmanager
def peer_errors(parallel) -> Iterator[None]:
    """A failure that another rank caused is raised as a WorkerLost that names the rank."""
    if parallel is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        lost = parallel.explain(exc)
        if lost is exc:
            raise
        raise lost from exc


def _close_engine(core: EngineCore | None, executor, parallel) -> None:
    try:
        if core is not None and not core.close():
            log.warning("the engine's loop did not stop within its bound; shutting down beside it")
        executor.shutdown()
    finally:
        if parallel is not None:
            parallel.close()


_NOT_HERE = (
    "LLM.{} needs a classification or reward head, which fastpath's Llama-family models do not have; "
    "embed(), encode() and score() pool their hidden states"
)


def _detokenizer(tokenizer: Any, params: SamplingParams) -> Any:
    """The tokenizer that spells logprobs' tokens: none where the request asked for no text."""
    return tokenizer if params.detokenize else None


def _conversations(messages: Any) -> list[Any]:
    """One conversation (a list of message dicts) or a list of them, as a list of conversations; a
    string, or anything else that is not made of messages, is a TypeError for the whole call."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(
            "messages must be a conversation (a list of {'role': ..., 'content': ...} dicts) or a list "
            f"of conversations, got {type(messages).__name__}"
            + (": wrap a prompt as [{'role': 'user', 'content': text}]" if isinstance(messages, str) else "")
        )
    if messages and isinstance(messages[0], Mapping):
        return [messages]
    for i, c in enumerate(messages):
        if isinstance(c, (str, bytes, Mapping)) or not isinstance(c, Sequence):
            raise TypeError(
                f"messages[{i}] must be a message dict (one conversation) or a list of them (one of "
                f"several conversations), got {type(c).__name__}"
            )
    return list(messages)


def flat_message(message: Mapping[str, Any]) -> Mapping[str, Any]:
    """A message whose content is a list of text parts, with that text as its content (what chat
    templates written for strings expect); any other part is a ValueError naming its type. A missing or
    null content (an assistant turn that only calls tools) is the empty string, as vLLM renders it."""
    if not isinstance(message, Mapping):
        return message
    content = message.get("content")
    if content is None:
        return {**message, "content": ""}
    if not isinstance(content, list):
        return message
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        # An assistant's refusal part (OpenAI's) is its text too.
        if kind not in ("text", "refusal") or not isinstance(part.get(kind), str):
            raise ValueError(f"only text content parts are supported, got a part of type {kind!r}")
        texts.append(part[kind])
    return {**message, "content": "\n".join(texts)}  # as vLLM joins them


def _prompt_list(prompts: Any) -> list[Any]:
    """One prompt or a sequence of them, as a list; anything else is a TypeError saying what is taken."""
    if is_single_prompt(prompts):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        return list(prompts)
    raise TypeError(
        "prompts must be a prompt (a string, a list of token ids, or a dict with 'prompt' or "
        f"'prompt_token_ids') or a list of prompts, got {type(prompts).__name__}"
    )


def _pooling_per_prompt(params: Any, n: int) -> list[PoolingParams]:
    if params is None or isinstance(params, PoolingParams):
        return [params or PoolingParams()] * n
    if not isinstance(params, (list, tuple)) or not all(isinstance(p, PoolingParams) for p in params):
        raise TypeError(
            f"pooling_params must be a PoolingParams or a list of them, got {type(params).__name__}"
        )
    if len(params) != n:
        raise ValueError(f"pooling_params has {len(params)} entries for {n} prompts")
    return list(params)


def _params_per_prompt(params: Params, n: int, default: SamplingParams) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or default] * n
    if not isinstance(params, (list, tuple)):
        raise TypeError(
            f"sampling_params must be a SamplingParams or a list of them, got {type(params).__name__}"
            + (" (SamplingParams(**that) makes one)" if isinstance(params, Mapping) else "")
        )
    params = list(params)
    if len(params) != n:
        raise ValueError(f"{n} prompts but {len(params)} SamplingParams")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):  # a None here is no default: it is a hole in the list
            raise TypeError(f"sampling_params[{i}] must be a SamplingParams, got {type(p).__name__}")
    return params


def _failed(request_id: str, prompt: Any, error: str) -> RequestOutput:
    from .outputs import CompletionOutput

    text = prompt if isinstance(prompt, str) else None
    return RequestOutput(
        request_id, text, [], None, [CompletionOutput(0, "", [], finish_reason="error")], True, error
    )


def _resolve_model(model: Any, seed: int, dtype: torch.dtype) -> tuple[ModelConfig, Path | None]:
    if isinstance(model, ModelConfig):
        return (model if model.random_seed is not None else model.replace(random_seed=seed)), None
    if isinstance(model, str) and model.startswith(RANDOM_PREFIX):
        return resolve_random(model, seed), None
    if isinstance(model, str) and model in CATALOG_MODELS:
        # A catalog name means the model, even where a folder of that name exists: write ./name for it.
        from ..model.catalog import checkpoint_for

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
