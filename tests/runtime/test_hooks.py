"""Runtime hooks: declarations, call order and guards, and the same tokens with every combination."""

import dataclasses
import itertools
import logging

import pytest
import torch

from fastpath.runtime import LLM, EventLists, RuntimeHooks, SamplingParams, runtime_hooks_of
from fastpath.runtime.engine.executor import StartupError
from fastpath.runtime.engine.outputs import EngineClosedError
from fastpath.runtime.events import health_check, retain_host_pages
from fastpath.runtime.hooks import ALL_OFF, HookError, hooks_from_lock
from fastpath.runtime.prologues import FusedDecodePrologue
from fastpath.runtime.runner.decode_inputs import CONTEXT_LEN, FIXED_COLUMNS, POSITION, SLOT, SRC_ROW, TOKEN

# --- declarations -------------------------------------------------------------------------------


class Plain:
    pass


class Declares:
    runtime_hooks = RuntimeHooks(loop_on_execution_stream=True)


def test_declarations_are_read_or_default_to_all_off():
    assert runtime_hooks_of(Plain()) is ALL_OFF and ALL_OFF.all_off
    none = Plain()
    none.runtime_hooks = None
    assert runtime_hooks_of(none) is ALL_OFF
    assert runtime_hooks_of(Declares).loop_on_execution_stream
    assert runtime_hooks_of(Declares()).loop_on_execution_stream
    inst = Plain()
    inst.runtime_hooks = RuntimeHooks(decode_prologue=FusedDecodePrologue())
    assert runtime_hooks_of(inst).decode_prologue is not None


def test_wrong_declarations_raise_type_errors_naming_the_type():
    bad = Plain()
    bad.runtime_hooks = {"loop_on_execution_stream": True}
    with pytest.raises(
        TypeError, match="Plain.runtime_hooks must be a fastpath.runtime.RuntimeHooks or None, got dict"
    ):
        runtime_hooks_of(bad)
    with pytest.raises(TypeError, match="loop_on_execution_stream must be bool, got int"):
        RuntimeHooks(loop_on_execution_stream=1)
    with pytest.raises(TypeError, match="decode_prologue must be a DecodePrologue, got str"):
        RuntimeHooks(decode_prologue="fastpath.runtime.prologues:FusedDecodePrologue")
    with pytest.raises(TypeError, match="executor_events must implement"):
        RuntimeHooks(executor_events=[print])


def test_hooks_are_immutable():
    hooks = RuntimeHooks()
    with pytest.raises(dataclasses.FrozenInstanceError):
        hooks.loop_on_execution_stream = True


def test_hooks_from_lock_imports_paths():
    hooks = hooks_from_lock(
        {
            "loop_on_execution_stream": True,
            "decode_prologue": "fastpath.runtime.prologues:FusedDecodePrologue",
            "executor_events": {
                "after_warmup": ["fastpath.runtime.events:retain_host_pages"],
                "at_shutdown": [],
            },
        }
    )
    assert isinstance(hooks.decode_prologue, FusedDecodePrologue)
    assert hooks.executor_events.after_warmup_fns == (retain_host_pages,)
    assert hooks_from_lock({}) == ALL_OFF


# --- call order and guards --------------------------------------------------------------------


class Recorder:
    """An ExecutorEvents that logs each event with the state the contract promises."""

    def __init__(self, fail_after_warmup: bool = False) -> None:
        self.log: list[tuple[str, bool]] = []
        self.fail = fail_after_warmup

    def after_warmup(self, ex):
        self.log.append(("after_warmup", ex.in_warmup_guard))
        if self.fail:
            raise RuntimeError("planted failure")

    def before_overlap_loop(self, ex):
        self.log.append(("before_overlap_loop", _scope_entered(ex)))

    def at_shutdown(self, ex):
        self.log.append(("at_shutdown", ex.in_warmup_guard))


def _scope_entered(ex) -> bool:
    return getattr(ex, "_scope_log", None) is not None and bool(ex._scope_log)


def _llm(hooks, **kw):
    return LLM("random:tiny-llama", device="cpu", max_seq_len=96, hooks=hooks, **kw)


def test_event_order_before_loop_once_and_shutdown():
    rec = Recorder()
    llm = _llm(RuntimeHooks(loop_on_execution_stream=True, executor_events=rec))
    ex = llm.executor
    scope_log: list[str] = []
    ex._scope_log = scope_log
    original = ex.execution_stream_scope

    def scope():
        scope_log.append("entered")
        return original()

    ex.execution_stream_scope = scope
    p = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    llm.generate([[5, 6]], p)
    llm.generate([[7, 8]], p)
    llm.close()
    assert [e for e, _ in rec.log] == ["after_warmup", "before_overlap_loop", "at_shutdown"]
    assert rec.log[0] == ("after_warmup", True), "after_warmup runs inside the warmup guard"
    assert rec.log[1] == ("before_overlap_loop", False), "before the loop's stream scope is entered"


def test_after_warmup_failure_aborts_start_up_naming_the_hook():
    rec = Recorder(fail_after_warmup=True)
    with pytest.raises(
        StartupError,
        match=r"executor_events.after_warmup hook .*Recorder.after_warmup raised RuntimeError: planted",
    ):
        _llm(RuntimeHooks(executor_events=rec))
    assert rec.log == [("after_warmup", True)]


def test_at_shutdown_runs_after_a_loop_error():
    rec = Recorder()
    llm = _llm(RuntimeHooks(executor_events=rec))

    def broken(*a, **k):
        raise RuntimeError("device fell over")

    llm.executor.launch_decode = broken
    with pytest.raises(RuntimeError, match="device fell over"):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert [e for e, _ in rec.log][-1] == "at_shutdown"


class ExplodingPrologue:
    """Declines during start-up, then fails on the first served step."""

    def __call__(self, executor, inputs) -> bool:
        if executor.in_warmup_guard:
            return False
        raise ValueError("planted prologue failure")


def test_a_failing_prologue_names_itself_and_closes_the_engine_with_the_reason():
    llm = _llm(RuntimeHooks(decode_prologue=ExplodingPrologue()))
    with pytest.raises(
        HookError, match=r"decode_prologue hook .*ExplodingPrologue raised ValueError: planted"
    ):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    with pytest.raises(
        EngineClosedError, match=r"the engine is closed: a step failed with HookError: .*planted"
    ):
        llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    with pytest.raises(EngineClosedError):
        llm.submit([5, 6, 7])


def test_loop_scope_is_gated_with_guided_decoding_and_logged(caplog):
    with caplog.at_level(logging.INFO, logger="fastpath.executor"):
        llm = _llm(RuntimeHooks(loop_on_execution_stream=True))
    armed, reason = llm.executor.loop_gate()
    assert not armed and "no CUDA stream" in reason
    assert "loop_on_execution_stream gated off" in caplog.text


def test_retain_host_pages_and_health_check(caplog):
    assert retain_host_pages(None) is True  # this CI machine runs glibc
    llm = _llm(RuntimeHooks())
    llm.generate([[5, 6]], SamplingParams(temperature=0.0, max_tokens=2))
    report = health_check(llm.executor)
    assert report["kv_blocks_leaked"] == 0 and report["requests_stranded"] == 0
    llm.executor.allocator.allocate(2)  # a planted leak
    with caplog.at_level(logging.WARNING, logger="fastpath.events"):
        assert health_check(llm.executor)["kv_blocks_leaked"] == 2
    assert "kv_blocks_leaked" in caplog.text


# --- same tokens with every combination ---------------------------------------------------------


class HostPrologue:
    """A decode_prologue that does not decline on CPU: unpacks the staged rows itself, embeddings included."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ex, inputs) -> bool:
        self.calls += 1
        b, packed = inputs.buffers, inputs.packed
        for r in range(packed.shape[0]):
            src = int(packed[r, SRC_ROW])
            b.input_ids[r] = inputs.prev_tokens[src] if src >= 0 else packed[r, TOKEN]
        b.positions.copy_(packed[:, POSITION])
        b.slot_mapping.copy_(packed[:, SLOT])
        b.context_lens.copy_(packed[:, CONTEXT_LEN])
        b.block_tables.copy_(packed[:, FIXED_COLUMNS:])
        b.embeds.copy_(torch.nn.functional.embedding(b.input_ids, ex.model.embed_tokens.weight))
        return True


class DecliningPrologue:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ex, inputs) -> bool:
        self.calls += 1
        return self.calls % 2 == 0 and HostPrologue()(ex, inputs)


PROMPTS = [[5, 6, 7, 8], list(range(10, 50)), [3]]
PARAMS = [
    SamplingParams(max_tokens=n, ignore_eos=True, temperature=t, seed=1)
    for n, t in ((12, 0), (9, 0.8), (15, 0))
]


@pytest.fixture(scope="module")
def all_off_tokens():
    return [o.outputs[0].token_ids for o in _llm(ALL_OFF, max_batch_size=2).generate(PROMPTS, PARAMS)]


@pytest.mark.parametrize(
    ("loop", "prologue", "events"),
    list(itertools.product([False, True], [None, "fused", "host", "declining"], [False, True])),
)
def test_every_hook_combination_gives_the_all_off_tokens(all_off_tokens, loop, prologue, events):
    pro = {
        None: None,
        "fused": FusedDecodePrologue(),
        "host": HostPrologue(),
        "declining": DecliningPrologue(),
    }[prologue]
    ev = EventLists((retain_host_pages,), (), (health_check,)) if events else None
    llm = _llm(RuntimeHooks(loop, pro, ev), max_batch_size=2)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == all_off_tokens
    if prologue in ("host", "declining"):
        assert pro.calls > 10, "the hook ran for the decode steps"
