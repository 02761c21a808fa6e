"""vLLM's offline beam search (`LLM.beam_search`), built on generate().

Each step asks every live beam for its next token's 2 * beam_width most likely tokens (one-token
requests with logprobs), and keeps each prompt's beam_width best extensions by vLLM's score: the
cumulative logprob over the sequence's length (prompt included, a final EOS not) to the power
`length_penalty`. A beam that draws an end-of-sequence token leaves the search as a finished
candidate; at the end each prompt keeps its beam_width best of the finished and the still-live beams.

Every step sends each beam whole, so without `enable_prefix_caching=True` each step prefills every
beam again; with it the beams' shared blocks are found and only their last tokens are computed.

As vLLM's offline search: `tokens` and `text` hold the prompt and the generation (the text is the
tokenizer's decode of all of them), and `cum_logprob` the generated tokens' raw logprobs. Beyond it:
every end-of-sequence id of the model ends a beam (vLLM's looks at the tokenizer's one), and each
sequence says why it ended (`finish_reason`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .admission import salted
from .outputs import Logprob
from .sampling_params import MAX_LOGPROBS, SamplingParams, doc
from .waiting import progress_bar

if TYPE_CHECKING:
    from .llm import LLM


@dataclass(slots=True)
class BeamSearchParams:
    """vLLM's `BeamSearchParams`: what `LLM.beam_search` keeps and for how long."""

    beam_width: int = field(metadata=doc("Beams kept per prompt, and sequences returned per prompt."))
    max_tokens: int = field(metadata=doc("Tokens generated at most per beam."))
    ignore_eos: bool = field(default=False, metadata=doc("Keep extending beams through EOS tokens."))
    temperature: float = field(
        default=0.0,
        metadata=doc(
            "Temperature of each step's one-token request; the scores use the model's raw logprobs, so it "
            "only decides which token beside the top 2 * beam_width each beam may also draw (0: none)."
        ),
    )
    length_penalty: float = field(
        default=1.0, metadata=doc("Score = cumulative logprob / length ** length_penalty (vLLM's).")
    )
    include_stop_str_in_output: bool = field(
        default=False,
        metadata=doc(
            "Accepted as vLLM's; its server uses it, and offline `text` is the whole sequence either way."
        ),
    )
    structured_outputs: Any = field(default=None, metadata=doc("None: beams do not follow a grammar here."))

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"BeamSearchParams.{name} must be an integer of at least 1, got {value!r}")
        if self.beam_width * 2 > MAX_LOGPROBS:
            raise ValueError(
                f"BeamSearchParams.beam_width must be at most {MAX_LOGPROBS // 2}, got {self.beam_width}: each "
                f"step asks every beam for its 2 * beam_width likeliest tokens, and a request gets at most "
                f"{MAX_LOGPROBS}"
            )
        if self.structured_outputs is not None:
            raise ValueError(
                "BeamSearchParams.structured_outputs: fastpath's beam search does not follow a grammar"
            )
        if not isinstance(self.temperature, int | float) or not 0 <= self.temperature < math.inf:
            raise ValueError(
                f"BeamSearchParams.temperature must be finite and >= 0, got {self.temperature!r}"
            )
        if not isinstance(self.length_penalty, int | float) or not math.isfinite(self.length_penalty):
            raise ValueError(f"BeamSearchParams.length_penalty must be finite, got {self.length_penalty!r}")


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: vLLM's `BeamSearchSequence`."""

    tokens: list[int] = field(metadata=doc("The prompt's token ids, then the generated ones (vLLM's)."))
    logprobs: list[dict[int, Logprob]] = field(
        default_factory=list, metadata=doc("Per generated token: the step's top tokens, by id.")
    )
    lora_request: Any = field(
        default=None, metadata=doc("The LoRARequest its prompt was searched with (None: the base model).")
    )
    cum_logprob: float = field(default=0.0, metadata=doc("Sum of the generated tokens' logprobs."))
    text: str | None = field(
        default=None,
        metadata=doc("All of `tokens` decoded, prompt included (vLLM's); None without a tokenizer."),
    )
    finish_reason: str | None = field(default=None, metadata=doc("stop (an EOS token) or length."))
    stop_reason: int | str | None = field(default=None, metadata=doc("None: EOS or length, as vLLM's."))


@dataclass(slots=True)
class BeamSearchOutput:
    """A prompt's best beams, best first: vLLM's `BeamSearchOutput`."""

    sequences: list[BeamSearchSequence]


def beam_score(
    tokens: Sequence[int], cum_logprob: float, eos_ids: frozenset[int], length_penalty: float
) -> float:
    """vLLM's `get_beam_search_score`: the length counts the prompt and leaves out a final EOS."""
    length = len(tokens) - (1 if tokens and tokens[-1] in eos_ids else 0)
    return cum_logprob / max(length, 1) ** length_penalty


@dataclass(slots=True)
class Search:
    """One prompt's search: its live beams and the ones an EOS ended."""

    params: BeamSearchParams
    beams: list[BeamSearchSequence]
    done: list[BeamSearchSequence] = field(default_factory=list)
    cache_salt: str | None = None  # its prompt's: every step's requests carry it to the prefix cache


def check_request(params: Any, concurrency_limit: Any) -> None:
    """TypeError or ValueError naming what LLM.beam_search cannot take."""
    if not isinstance(params, BeamSearchParams):
        raise TypeError(f"beam_search takes a BeamSearchParams, got {type(params).__name__}")
    if concurrency_limit is not None and (
        isinstance(concurrency_limit, bool) or not isinstance(concurrency_limit, int) or concurrency_limit < 1
    ):
        raise ValueError(f"concurrency_limit must be an integer of at least 1, got {concurrency_limit!r}")


def beam_search(
    llm: LLM,
    prompt_ids: Sequence[list[int]],
    params: BeamSearchParams,
    use_tqdm: bool | Callable[..., Any] = False,
    concurrency_limit: int | None = None,
    lora_requests: Sequence[Any] | None = None,
    cache_salts: Sequence[str | None] | None = None,
) -> list[BeamSearchOutput]:
    """The search over prompts already admitted (`LLM.beam_search` encodes and checks them), at most
    `concurrency_limit` prompts' beams at a time."""
    loras = lora_requests if lora_requests is not None else [None] * len(prompt_ids)
    salts = cache_salts if cache_salts is not None else [None] * len(prompt_ids)
    searches = [
        Search(params, [BeamSearchSequence(tokens=list(ids), lora_request=lora)], cache_salt=salt)
        for ids, lora, salt in zip(prompt_ids, loras, salts, strict=True)
    ]
    chunk = concurrency_limit or max(len(searches), 1)
    # One bar over every step of every group of prompts (vLLM's "Beam search" bar), not one a step.
    bar = progress_bar(use_tqdm, -(-len(searches) // chunk) * params.max_tokens, "Beam search")
    try:
        for lo in range(0, len(searches), chunk):
            _run(llm, searches[lo : lo + chunk], params, bar)
    finally:
        if bar is not None:
            bar.close()
    return [_finish(llm, s) for s in searches]


def step_params(params: BeamSearchParams) -> SamplingParams:
    """Each step's one-token request for a beam: its 2 * beam_width likeliest next tokens."""
    return SamplingParams(
        max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature, ignore_eos=True
    )


def live_beams(searches: list[Search]) -> list[tuple[Search, BeamSearchSequence]]:
    return [(s, beam) for s in searches for beam in s.beams]


def extend(
    live: list[tuple[Search, BeamSearchSequence]],
    outs: list[Any],
    eos_ids: frozenset[int],
    params: BeamSearchParams,
) -> None:
    """One step: each live beam's children from its one-token request's output (in `live`'s order);
    an EOS child leaves the search as a finished candidate; each search keeps its best beam_width."""
    searches = {id(s): s for s, _ in live}
    grown: dict[int, list[BeamSearchSequence]] = {key: [] for key in searches}
    for (search, beam), out in zip(live, outs, strict=True):
        top = out.outputs[0].logprobs[0]
        for token, lp in top.items():
            child = BeamSearchSequence(
                tokens=[*beam.tokens, token],
                logprobs=[*beam.logprobs, top],
                lora_request=beam.lora_request,
                cum_logprob=beam.cum_logprob + lp.logprob,
            )
            if token in eos_ids and not params.ignore_eos:
                child.finish_reason = "stop"
                search.done.append(child)
            else:
                grown[id(search)].append(child)
    for key, search in searches.items():
        search.beams = _best(grown[key], eos_ids, params)


def _run(llm: LLM, searches: list[Search], params: BeamSearchParams, bar: Any) -> None:
    step = step_params(params)
    for i in range(params.max_tokens):
        live = live_beams(searches)
        if not live:  # every beam ended early: the bar still counts the steps not taken
            if bar is not None:
                bar.update(params.max_tokens - i)
            return
        loras = [beam.lora_request for _, beam in live]
        adapters = {"lora_request": loras} if any(r is not None for r in loras) else {}
        asks = [salted({"prompt_token_ids": beam.tokens}, search.cache_salt) for search, beam in live]
        outs = llm.generate(asks, step, use_tqdm=False, **adapters)
        if bar is not None:
            bar.update(1)
        extend(live, outs, llm.eos_ids, params)


def _best(
    beams: list[BeamSearchSequence], eos_ids: frozenset[int], params: BeamSearchParams
) -> list[BeamSearchSequence]:
    # sorted() is stable: equal scores keep the order the steps produced them in.
    key = lambda b: beam_score(b.tokens, b.cum_logprob, eos_ids, params.length_penalty)  # noqa: E731
    return sorted(beams, key=key, reverse=True)[: params.beam_width]


def best_beams(search: Search, eos_ids: frozenset[int]) -> list[BeamSearchSequence]:
    """A search's result: its beam_width best of the finished and the live beams, best first."""
    for beam in search.beams:
        beam.finish_reason = "length"
    return _best(search.done + search.beams, eos_ids, search.params)


def _finish(llm: LLM, search: Search) -> BeamSearchOutput:
    best = best_beams(search, llm.eos_ids)
    for beam in best:
        beam.text = llm.tokenizer.decode(beam.tokens) if llm.tokenizer is not None else None
    return BeamSearchOutput(best)
