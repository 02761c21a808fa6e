"""A grammar after a reasoning model's thinking (GuidedDecodingParams.after_reasoning): the model writes
freely until its close marker, then the grammar holds the rest; a prompt that already closed the
thinking gets the grammar from the first token. Both fills (the C++ one and Python's), on the CPU.

The tiny model's tokenizer has no thinking markers, so the markers' token ids are picked from what the
model writes (admission._one_token patched): the close marker is a token its free run writes a few
steps in."""

import pytest

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.engine import admission

pytest.importorskip("xgrammar")

PROMPT = list(range(7, 19))
CHOICES = ["yes", "no"]


@pytest.fixture(scope="module", params=["native", "python"])
def llm(request, tiny_text_checkpoint):
    from fastpath.runtime.guided import decoder

    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setattr(decoder, "matcher_api", lambda extension: None)
        engine = LLM(
            str(tiny_text_checkpoint),
            device="cpu",
            max_seq_len=256,
            max_batch_size=4,
            guided_backend="xgrammar",
        )
    assert engine.executor.guided.fill == request.param
    yield engine
    engine.close()


def _markers(monkeypatch, opening: int | None, closing: int | None) -> None:
    ids = {"<t>": opening, "</t>": closing}
    monkeypatch.setattr(admission, "_one_token", lambda tokenizer, marker: ids[marker])


def _run(llm, prompt, **guided) -> list[int]:
    params = SamplingParams(max_tokens=40, temperature=0, guided={"choice": CHOICES, **guided})
    return list(llm.generate([prompt], params)[0].outputs[0].token_ids)


def test_the_model_thinks_freely_then_the_grammar_holds_the_answer(llm, monkeypatch):
    free = list(llm.generate([PROMPT], SamplingParams(max_tokens=12, temperature=0))[0].outputs[0].token_ids)
    # The close marker: a token the free run writes at step k and not before (nor in the prompt).
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i] and free[i] not in PROMPT)
    _markers(monkeypatch, None, free[k])
    out = _run(llm, PROMPT, after_reasoning=["<t>", "</t>"])
    assert out[: k + 1] == free[: k + 1]  # the thinking, marker included, is the free run's
    assert llm.get_tokenizer().decode(out[k + 1 :], skip_special_tokens=True) in CHOICES
    # Without the markers the grammar holds the reply from its first token.
    assert llm.get_tokenizer().decode(_run(llm, PROMPT), skip_special_tokens=True) in CHOICES


def test_a_prompt_that_closed_the_thinking_gets_the_grammar_at_once(llm, monkeypatch):
    # The close marker after the open one in the prompt: thinking is over (a template that turned it off).
    _markers(monkeypatch, PROMPT[2], PROMPT[-1])
    assert (
        llm.get_tokenizer().decode(
            _run(llm, PROMPT, after_reasoning=["<t>", "</t>"]), skip_special_tokens=True
        )
        in CHOICES
    )
    # An open marker after the last close: thinking is open, and the reply starts free. The model never
    # writes this close marker (a token outside its free run), so no grammar ever holds it.
    free = list(llm.generate([PROMPT], SamplingParams(max_tokens=40, temperature=0))[0].outputs[0].token_ids)
    never = next(t for t in range(3, 500) if t not in free and t not in PROMPT)
    _markers(monkeypatch, PROMPT[-1], never)
    assert _run(llm, PROMPT, after_reasoning=["<t>", "</t>"]) == free


def test_markers_that_are_not_one_token_fail_the_request_by_name(llm, monkeypatch):
    _markers(monkeypatch, None, None)
    with pytest.raises(ValueError, match="after_reasoning: '</t>' is not one token"):
        _run(llm, PROMPT, after_reasoning=["<t>", "</t>"])
    with pytest.raises(ValueError, match="after_reasoning must be"):
        SamplingParams(guided={"choice": CHOICES, "after_reasoning": ["</t>"]})


def test_the_gate_reads_the_prompts_last_markers():
    class Tokens:
        def encode(self, text, add_special_tokens=False):
            return {"<think>": [1], "</think>": [2]}.get(text, [9, 9])

    tok = Tokens()
    gate = admission.reasoning_gate
    assert gate(None, [1, 2], tok) is None
    assert gate(("<think>", "</think>"), [5, 1, 6], tok) == 2  # open in the prompt: gated
    assert gate(("<think>", "</think>"), [5, 6], tok) == 2  # no marker yet: the model opens it
    assert gate(("<think>", "</think>"), [1, 6, 2, 7], tok) is None  # closed in the prompt
    assert gate(("<think>", "</think>"), [1, 2, 5, 1], tok) == 2  # a later turn opened it again
    assert gate(("<x>", "</think>"), [2], tok) is None  # the open marker not a token: the close decides
    with pytest.raises(ValueError, match="is not one token"):
        gate(("<think>", "</x>"), [], tok)
    with pytest.raises(ValueError, match="needs the model's tokenizer"):
        gate(("<think>", "</think>"), [], None)
