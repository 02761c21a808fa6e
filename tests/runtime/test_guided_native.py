"""xgrammar's own paths: its calls hold the GIL in the Python fill, and the dispatch extension's C++
fill drives its matchers without the GIL and gives the Python fill's tokens."""

import warnings

import pytest
from guided_cases import PROMPTS, SCHEMAS

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.guided.spec import parse_spec

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm(tiny_text_checkpoint):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(
            "FASTPATH_GUIDED_FILL_THREADS", "1"
        )  # the one-thread fill the pooled one is checked against
        engine = LLM(
            str(tiny_text_checkpoint),
            device="cpu",
            max_seq_len=320,
            max_batch_size=8,
            guided_backend="xgrammar",
        )
    yield engine
    engine.close()


def _guided(spec, seed, max_tokens=200):
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, guided=spec)


def test_matcher_calls_hold_the_gil_without_touching_xgrammars_own_wrappers(llm):
    from xgrammar.tvm_ffi_binding import BatchGrammarMatcher

    calls = llm.executor.guided.calls
    assert calls.holds_gil, "the installed xgrammar exposes its tvm-ffi methods; the fill must hold the GIL"
    assert calls._fill.release_gil is False
    shared = {m.name: m.func for m in BatchGrammarMatcher.__tvm_ffi_type_info__.methods}
    assert (
        shared["batch_fill_next_token_bitmask"].release_gil is True
    )  # other users in the process keep theirs


def test_the_native_binding_runs_the_fill_in_cpp(llm):
    assert llm.executor.guided.fill == "native"


def test_the_python_fill_gives_the_same_tokens_as_the_native_fill(tiny_text_checkpoint, llm, monkeypatch):
    from fastpath.runtime.guided import decoder

    monkeypatch.setattr(decoder, "matcher_api", lambda extension: None)
    python = LLM(
        str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=8, guided_backend="xgrammar"
    )
    assert python.executor.guided.fill == "python"
    params = [_guided({"json_schema": schema}, seed) for seed, schema in enumerate(SCHEMAS.values())]
    prompts = (PROMPTS * 2)[: len(params)]
    native_outs, python_outs = llm.generate(prompts, params), python.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in native_outs] == [o.outputs[0].token_ids for o in python_outs]
    python.close()


def test_a_native_fill_on_a_worker_thread_matches_xgrammar_and_reports_refused_tokens(llm):
    """The doorbell's worker (a simulated device) runs the fill: no GIL, not the launching thread."""
    import numpy as np
    import xgrammar as xgr
    from hostdispatch_exts import sim_extension

    from fastpath.runtime import _hostdispatch as ext
    from fastpath.runtime.dispatch.dispatcher import HostDispatcher, HostDispatchFallbackWarning

    g = llm.executor.guided
    sim = sim_extension()
    stream = sim.SimStream()
    with warnings.catch_warnings():  # the fall back to the doorbell warns once per process
        warnings.simplefilter("ignore", HostDispatchFallbackWarning)
        d = HostDispatcher("spin", extension=ext, device=sim.SimDevice(hostfunc_v2=False), stream=stream)
    assert d.backend == "doorbell"
    spec = parse_spec({"regex": "[a-z]{2,6}!"})
    state, reference = g.state_for(spec), xgr.GrammarMatcher(g.cache.get(spec))
    good = llm.tokenizer.encode("ab", add_special_tokens=False)[0]
    bad = llm.tokenizer.encode("9", add_special_tokens=False)[0]
    assert reference.accept_token(good)
    expected = np.full((1, g.words), -1, dtype=np.int32)
    reference.fill_next_token_bitmask(expected, 0)
    seqs = [None, type("Seq", (), {"guided": state})()]
    for token, live in ((good, True), (bad, False)):
        g.host_tokens[1] = token
        g.enqueue(seqs, 3)
        d.launch_guided_fill(g.filler)
        stream.synchronize()
        assert state.row.live is live and g.host_rows[:3].tolist() == [0, int(live), 0]
        if live:
            assert (g.host_mask[1].numpy() == expected[0]).all()
    assert state.row.accepted == 2 and state.error == f"token {bad} was sampled outside the grammar"
    d.shutdown(5.0)
    stream.close()


def test_a_native_fill_reports_a_step_without_a_plan_and_refuses_bad_buffers_and_long_plans(llm):
    import torch

    from fastpath.runtime import _hostdispatch as ext
    from fastpath.runtime.dispatch.dispatcher import HostDispatcher

    tokens, flags = torch.zeros(4, dtype=torch.int64), torch.ones(4, dtype=torch.int32)
    fill = ext.GuidedFill(tokens, torch.zeros(4, 3, dtype=torch.int32), flags, 4, 3)
    d = HostDispatcher("inline", device="cpu")
    d.launch_guided_fill(fill)  # nothing enqueued
    assert fill.take_errors() == [
        "a guided fill ran with no row plan queued: this step's rows run unconstrained"
    ]
    assert flags.tolist() == [0, 0, 0, 0] and fill.take_errors() == []
    with pytest.raises(ValueError, match="a row plan of 5 rows; this fill holds 4"):
        fill.enqueue([None] * 5)
    with pytest.raises(
        ValueError, match="GuidedFill: mask is not a contiguous CPU tensor of the expected size"
    ):
        ext.GuidedFill(tokens, torch.zeros(3, 4, dtype=torch.int32).t(), flags, 4, 3)
    with pytest.raises(ValueError, match="GuidedFill: tokens is not a contiguous CPU tensor"):
        ext.GuidedFill(tokens.int(), torch.zeros(4, 3, dtype=torch.int32), flags, 4, 3)


def test_a_fill_spread_over_threads_gives_the_one_thread_tokens(tiny_text_checkpoint, llm, monkeypatch):
    """FASTPATH_GUIDED_FILL_THREADS: the C++ fill shares each step's rows with a pool; every row's
    matcher and mask row are its own, so tokens, errors and finish reasons do not change."""
    from fastpath.runtime.guided.decoder import FILL_THREADS_ENV

    monkeypatch.setenv(FILL_THREADS_ENV, "3")
    pooled = LLM(
        str(tiny_text_checkpoint), device="cpu", max_seq_len=320, max_batch_size=8, guided_backend="xgrammar"
    )
    assert (pooled.executor.guided.fill, pooled.executor.guided.fill_threads) == ("native", 3)
    assert llm.executor.guided.fill_threads == 1
    specs = [{"json_schema": schema} for schema in SCHEMAS.values()] + [{"regex": "[a-z]{2,6}!"}, None]
    params = [_guided(spec, seed) if spec else SamplingParams(max_tokens=30, seed=seed, temperature=1.0)
              for seed, spec in enumerate(specs * 2)]  # fmt: skip
    prompts = (PROMPTS * 8)[: len(params)]
    one, many = llm.generate(prompts, params), pooled.generate(prompts, params)
    assert [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in one] == [
        (o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in many
    ]
    pooled.close()


@pytest.mark.parametrize("value", ["0", "65", "many"])
def test_a_bad_fill_thread_count_is_refused_by_name(tiny_text_checkpoint, monkeypatch, value):
    from fastpath.runtime.guided.decoder import FILL_THREADS_ENV

    monkeypatch.setenv(FILL_THREADS_ENV, value)
    with pytest.raises(Exception, match=FILL_THREADS_ENV):
        LLM(
            str(tiny_text_checkpoint),
            device="cpu",
            max_seq_len=320,
            max_batch_size=8,
            guided_backend="xgrammar",
        )


def test_a_fill_records_each_decode_steps_duration_and_takes_a_new_thread_count_between_runs(llm):
    """The bench reads a step's fill time from `step_durations_us`; `set_threads` resizes the pool
    between generations without changing a token."""
    filler = llm.executor.guided.filler
    params = [_guided({"regex": "[a-z]{2,6}!"}, seed) for seed in range(4)]
    prompts = (PROMPTS * 4)[: len(params)]
    steps = filler.steps
    one = llm.generate(prompts, params)
    new = filler.steps - steps
    durations = filler.step_durations_us()
    assert new > 0 and len(durations) == min(filler.steps, 4096)
    assert all(d > 0 for d in durations[-new:])
    before = filler.threads
    try:
        filler.set_threads(3)
        assert llm.executor.guided.fill_threads == 3
        many = llm.generate(prompts, params)
    finally:
        filler.set_threads(before)
    assert llm.executor.guided.fill_threads == before
    assert [o.outputs[0].token_ids for o in one] == [o.outputs[0].token_ids for o in many]
    with pytest.raises(ValueError, match="threads must be 1 to 64, not 0"):
        filler.set_threads(0)


def test_a_pool_resized_while_steps_fill_changes_no_token(llm):
    """set_threads from another thread while generate runs: a fill holds the pool while it uses it,
    so no step's rows are lost, run twice, or filled on a freed pool."""
    import threading

    filler = llm.executor.guided.filler
    params = [_guided({"regex": "[a-z]{2,12}!"}, seed) for seed in range(6)]
    prompts = (PROMPTS * 6)[: len(params)]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    before, done, resizes = filler.threads, threading.Event(), []

    def resize():
        counts = [1, 2, 4, 3]
        while not done.is_set():
            filler.set_threads(counts[len(resizes) % len(counts)])
            resizes.append(filler.steps)

    resizer = threading.Thread(target=resize)
    resizer.start()
    try:
        resized = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    finally:
        done.set()
        resizer.join()
        filler.set_threads(before)
    assert resized == alone
    assert len(set(resizes)) > 2, "the pool was not resized between steps of the generation"


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (5, 2), (16, 8), (64, 8)])
def test_the_fill_takes_half_the_usable_cpus_up_to_eight_unless_told(monkeypatch, cpus, threads):
    from fastpath.runtime.guided import decoder

    monkeypatch.delenv(decoder.FILL_THREADS_ENV, raising=False)
    monkeypatch.setattr(decoder, "usable_cpus", lambda: cpus)
    assert decoder.fill_threads() == threads
    monkeypatch.setenv(decoder.FILL_THREADS_ENV, "3")
    assert decoder.fill_threads() == 3
