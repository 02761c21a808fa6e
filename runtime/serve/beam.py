"""`use_beam_search`: vLLM's server beam search, for completions and chat.

The request's `n` is the beam width and the number of choices returned, best first; `length_penalty`
weighs the score as in `LLM.beam_search` (engine/beam_search.py), whose steps this runs: each step
submits one one-token request per live beam, asking for its 2 * n likeliest tokens, and keeps each
prompt's n best extensions. The response comes whole once the search ends (streamed: in one chunk
per choice, as vLLM's), its text the generated tokens decoded without a final EOS, as vLLM's server.

What beams do not use is refused by name where it would change the output, instead of dropped as
vLLM's server drops it: stop strings and stop tokens, min_tokens, grammars, biases, bans, penalties,
top-k/top-p/min-p below their neutral values, and `echo`; so are more logprobs than a step asks for
(2 * n). Neutral values (`top_p: 1`, `logit_bias: {}`, `stop: []`) and a seed pass: the steps take the
likeliest tokens, so a seed changes nothing at temperature 0 and only the extra draw above it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..engine.admission import salted
from ..engine.beam_search import (
    BeamSearchParams,
    BeamSearchSequence,
    Search,
    best_beams,
    extend,
    live_beams,
    step_params,
)
from ..engine.outputs import CompletionOutput, RequestOutput
from ..engine.sampling_params import SamplingParams
from .errors import RequestInvalid
from .generation import Generation, admit_and_submit, failure, merged, submit_in_thread
from .params import RequestKeys
from .state import ServerState

# Request fields a beam search does not use, and the values that leave the output unchanged.
_EMPTY = (None, "", [], {})
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "stop": _EMPTY,
    "stop_token_ids": _EMPTY,
    "min_tokens": (0,),
    "logit_bias": _EMPTY,
    "allowed_token_ids": (None,),
    "bad_words": _EMPTY,
    "presence_penalty": (0, None),
    "frequency_penalty": (0, None),
    "repetition_penalty": (1, None),
    "top_p": (1, None),
    "top_k": (0, -1, None),
    "min_p": (0, None),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "structured_outputs": (None,),
    "echo": (False,),
    "prompt_logprobs": (None,),
}


def beam_params(req: Any, params: SamplingParams, top: int | None) -> BeamSearchParams:
    """The request's beam search, from its resolved SamplingParams (`n`, `max_tokens`, `temperature`,
    `ignore_eos`); `top`: the logprobs a choice lists. RequestInvalid names a field beams do not use,
    a width they cannot take, or more logprobs than a step has."""
    for name, neutral in NEUTRAL.items():
        if (
            name in type(req).model_fields
            and name in req.model_fields_set
            and getattr(req, name) not in neutral
        ):
            raise RequestInvalid(
                f"{name} does not apply to use_beam_search: beams keep the likeliest tokens by logprob",
                name,
            )
    if params.guided_decoding is not None:
        raise RequestInvalid("use_beam_search: beams do not follow a grammar", "response_format")
    try:
        beam = BeamSearchParams(
            beam_width=params.n,
            max_tokens=params.max_tokens if params.max_tokens is not None else 1 << 30,
            ignore_eos=params.ignore_eos,
            temperature=params.temperature,
            length_penalty=req.length_penalty,
        )
    except ValueError as exc:
        message = str(exc).replace("BeamSearchParams.beam_width", "n (the beam width)")
        param = "n" if "beam_width" in str(exc) else "length_penalty"
        raise RequestInvalid(message.replace("BeamSearchParams.", ""), param) from None
    if top is not None and top > 2 * beam.beam_width:
        key = "top_logprobs" if "top_logprobs" in type(req).model_fields else "logprobs"
        raise RequestInvalid(
            f"{key} is {top}; with use_beam_search each token lists at most 2 * n = "
            f"{2 * beam.beam_width} alternatives, the tokens each step weighs",
            key,
        )
    return beam


class BeamGeneration(Generation):
    """A beam search behind Generation's face: `outputs()` yields each prompt's whole output, once."""

    def __init__(
        self,
        state: ServerState,
        handles: list,
        arrival: float,
        stream: bool,
        params: BeamSearchParams,
        top: int | None,
        rid: str,
        keys: RequestKeys,
        lora: Any = None,
        cache_salt: str | None = None,
    ):
        """`handles`: each prompt's first step; `top`: the logprobs a choice lists (None: none);
        `lora`: the LoRARequest every step runs with; `cache_salt`: the request's, every step's too."""
        super().__init__(state, handles, arrival, params.beam_width * len(handles), stream)
        self.params, self.top, self.rid, self.keys, self.lora = params, top, rid, keys, lora
        self.cache_salt = cache_salt
        self.prompts = [(h.prompt, list(h.prompt_ids)) for h in handles]
        self._step_handles = handles

    @classmethod
    async def begin(
        cls,
        state: ServerState,
        prompts: Callable[[], list[Any]],
        prompt_count: int,
        params: BeamSearchParams,
        top: int | None,
        rid: str,
        stream: bool,
        keys: RequestKeys,
        truncate: int | None = None,
        lora: Any = None,
        cache_salt: str | None = None,
    ) -> BeamGeneration:
        """Admit the request (503 at capacity) and submit each prompt's first step (which truncates
        the prompt as `truncate_prompt_tokens` asks; later steps send the beams' tokens)."""
        arrival = time.monotonic()
        first = step_params(params).clone(truncate_prompt_tokens=truncate)
        completions = params.beam_width * prompt_count
        handles = await admit_and_submit(state, completions, prompts, first, f"{rid}-s0", False, keys, lora)
        return cls(state, handles, arrival, stream, params, top, rid, keys, lora, cache_salt)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(ids) for _, ids in self.prompts)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        llm, params = self.state.llm, self.params
        searches = [Search(params, [BeamSearchSequence(tokens=ids)]) for _, ids in self.prompts]
        # A prompt's steps: max_tokens, or as many as its context has room for.
        room = llm.config.max_seq_len
        limits = {
            id(s): min(params.max_tokens, room - len(ids))
            for s, (_, ids) in zip(searches, self.prompts, strict=True)
        }
        live = live_beams(searches)
        for step in range(max(limits.values(), default=0)):
            if step:
                live = [(s, beam) for s, beam in live_beams(searches) if step < limits[id(s)]]
                if not live:
                    break
                asks = [salted({"prompt_token_ids": beam.tokens}, self.cache_salt) for _, beam in live]
                rid = f"{self.rid}-s{step}"
                self._step_handles = await submit_in_thread(
                    self.state, lambda asks=asks: asks, step_params(params), rid, False, self.keys, self.lora
                )
            extend(live, await self._results(self._step_handles), llm.eos_ids, params)
            if not step:  # every prompt's first tokens: the time to first token, as a stream counts it
                ttft = time.monotonic() - self.arrival
                self.state.metrics.ttft.observe(ttft)
                self.timeline.setdefault("ttft_ms", round(ttft * 1e3, 3))
        tokenizer = llm.get_tokenizer()
        for i, (search, (prompt, ids)) in enumerate(zip(searches, self.prompts, strict=True)):
            best = best_beams(search, llm.eos_ids)
            choices = [self._choice(j, beam, len(ids), llm.eos_ids, tokenizer) for j, beam in enumerate(best)]
            self._reasons += [c.finish_reason for c in choices]
            self._sizes += [(len(ids), len(c.token_ids)) for c in choices]
            yield i, RequestOutput(self.rid, prompt, ids, None, choices, finished=True)

    async def collect(self) -> list[RequestOutput]:
        return [out async for _, out in self.outputs()]

    async def _results(self, handles: list) -> list[RequestOutput]:
        async for i, out in merged(handles):
            if out.error is not None:
                raise failure(handles[i], out.error)
        return [h.result() for h in handles]

    def _choice(
        self, index: int, beam: BeamSearchSequence, prompt_len: int, eos, tokenizer
    ) -> CompletionOutput:
        tokens = beam.tokens[prompt_len:]
        shown = tokens[:-1] if beam.finish_reason == "stop" and tokens and tokens[-1] in eos else tokens
        logprobs = None
        if self.top is not None:
            logprobs = [
                {t: lp for t, lp in step.items() if lp.rank <= self.top or t == chosen}
                for step, chosen in zip(beam.logprobs, tokens, strict=True)
            ]
        return CompletionOutput(
            index,
            tokenizer.decode(shown) if tokenizer is not None else "",
            tokens,
            beam.cum_logprob,
            logprobs,
            beam.finish_reason or "length",
        )

    def abort(self) -> None:
        for h in self._step_handles:
            h.abort()

    def close(self) -> None:
        self.handles = self._step_handles
        super().close()
