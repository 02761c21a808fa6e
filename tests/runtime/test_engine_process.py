"""engine_process=True: the engine in a process of its own gives what the in-process engine gives,
and its end (a close, a kill, a failed start) reaches every caller as a clear error."""

import os
import signal
import threading
import time

import pytest

from fastpath.runtime import LLM, EngineClosedError, SamplingParams
from fastpath.runtime.engine.native_executor import NativeExecutor

BOUND_S = 60
OPTIONS = dict(device="cpu", max_seq_len=128, max_batch_size=8, guided_backend="auto")
PROMPTS = ["The capital of France", "One, two, three,", [5, 17, 9, 40, 41]]
CASES = [
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3),
    SamplingParams(temperature=0.9, top_p=0.9, seed=7, n=3, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, min_tokens=4, prompt_logprobs=2),
]


@pytest.fixture(scope="module")
def engines(tiny_text_checkpoint):
    local = LLM(str(tiny_text_checkpoint), **OPTIONS)
    remote = LLM(str(tiny_text_checkpoint), **OPTIONS, engine_process=True)
    yield local, remote
    remote.close()
    local.close()


def _plain(outputs):
    return [
        (o.prompt_token_ids, o.prompt_logprobs, [(c.index, c.text, c.token_ids, c.logprobs, c.finish_reason) for c in o.outputs])
        for o in outputs
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(len(CASES)))
def test_generate_equals_the_in_process_engine(engines, case):
    local, remote = engines
    params = CASES[case]
    assert remote.executor is None and remote.core.process.pid != os.getpid()
    assert _plain(remote.generate(PROMPTS, params, use_tqdm=False)) == _plain(
        local.generate(PROMPTS, params, use_tqdm=False)
    )


def test_stop_strings_and_streams_match(engines):
    local, remote = engines
    whole = local.generate(
        ["One, two, three,"], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False
    )
    text = whole[0].outputs[0].text
    assert len(text) > 3
    stop = SamplingParams(temperature=0.0, max_tokens=16, stop=[text[2:4]])
    assert _plain(remote.generate(["One, two, three,"], stop, use_tqdm=False)) == _plain(
        local.generate(["One, two, three,"], stop, use_tqdm=False)
    )
    deltas = list(remote.stream(["One, two, three,"], SamplingParams(temperature=0.0, max_tokens=16)))
    assert len(deltas) > 1, "a stream hears of tokens as steps complete, not only at the end"
    assert "".join(d.outputs[0].text for d in deltas) == text
    assert [t for d in deltas for t in d.outputs[0].token_ids] == whole[0].outputs[0].token_ids


def test_a_streamed_batch_mixing_plain_rows_logprobs_and_n_matches(engines):
    """Streamed rows whose only news is a token travel as bare (id, token) pairs; rows with logprobs,
    a first token or a finish travel whole. In one batch, every request's stream adds up to what the
    in-process engine gives."""
    local, remote = engines
    prompts = [[5, 17, 9, 40, 41], "One, two, three,", [7, 7, 8], "The capital of France"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=3, n=2, max_tokens=10, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=6),
    ]
    got: dict[tuple[str, int], list] = {}
    for delta in remote.stream(prompts, params):
        for c in delta.outputs:
            ids, lps = got.setdefault((delta.request_id, c.index), ([], []))
            ids += c.token_ids
            lps += c.logprobs or []
    want = local.generate(prompts, params, use_tqdm=False)
    rids = sorted({rid for rid, _ in got}, key=int)
    assert len(rids) == len(prompts)
    for rid, out in zip(rids, want, strict=True):
        for c in out.outputs:
            assert got[(rid, c.index)] == (c.token_ids, c.logprobs or []), (rid, c.index)


def test_threads_share_the_engine_process(engines):
    local, remote = engines
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    prompts = [[5 + i, 17, 9 + i] for i in range(12)]
    solo = [o.outputs[0].token_ids for o in local.generate(prompts, params, use_tqdm=False)]
    got: dict[int, list[int]] = {}

    def caller(i: int) -> None:
        got[i] = remote.generate([prompts[i]], params, use_tqdm=False)[0].outputs[0].token_ids

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    assert [got.get(i) for i in range(len(prompts))] == solo


def test_an_abort_frees_the_blocks_in_the_engine_process(engines):
    _, remote = engines
    total = remote.stats().kv_blocks_total
    handle = remote.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    deadline = time.monotonic() + BOUND_S
    while remote.stats().kv_blocks_free == total and time.monotonic() < deadline:
        time.sleep(0.01)
    assert remote.stats().running == 1
    handle.abort()
    out = handle.result(timeout=BOUND_S)
    assert out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 100
    while remote.stats().kv_blocks_free != total and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = remote.stats()
    assert (stats.kv_blocks_free, stats.running, stats.waiting) == (total, 0, 0)


def test_guided_requests_and_their_errors(engines):
    pytest.importorskip("xgrammar")
    _, remote = engines
    params = SamplingParams(temperature=0.0, max_tokens=20, guided={"choice": ["yes", "no"]})
    assert remote.generate(["Answer:"], params, use_tqdm=False)[0].outputs[0].text in ("yes", "no")
    with pytest.raises(ValueError, match="regex"):
        remote.submit("x", SamplingParams(guided={"regex": "("}))
    assert remote.generate(["Answer:"], params, use_tqdm=False)[0].outputs[0].text in ("yes", "no")


class FailingExecutor(NativeExecutor):
    def __init__(self, *args, **kwargs):
        raise ValueError("this executor refuses to start")


def test_a_failed_start_raises_the_engines_error():
    with pytest.raises(ValueError, match="this executor refuses to start"):
        LLM("random:tiny-llama", device="cpu", engine_process=True, executor_cls=FailingExecutor)


def test_arguments_that_cannot_travel_are_named():
    from fastpath.runtime import RuntimeHooks

    hooks = RuntimeHooks(decode_prologue=lambda *a: None)
    with pytest.raises(TypeError, match="engine_process=True.*importable by name"):
        LLM("random:tiny-llama", device="cpu", engine_process=True, hooks=hooks)


def test_a_killed_engine_process_fails_its_requests_and_names_the_cause():
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=2048, engine_process=True)
    try:
        handle = llm.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True))
        os.kill(llm.core.process.pid, signal.SIGKILL)
        out = handle.result(timeout=BOUND_S)
        assert out.error is not None and "exited with code -9" in out.error
        with pytest.raises(EngineClosedError, match="exited with code -9"):
            llm.generate([[5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        llm.close()


def test_close_ends_running_requests_and_the_process():
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=2048, engine_process=True)
    process = llm.core.process
    handle = llm.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=2000, ignore_eos=True))
    start = time.monotonic()
    llm.close()
    assert time.monotonic() - start < BOUND_S and not process.is_alive() and process.exitcode == 0
    out = handle.result(timeout=BOUND_S)
    assert out.finished and (out.error is not None or out.outputs[0].finish_reason is not None)
    with pytest.raises(EngineClosedError):
        llm.submit([5], SamplingParams(max_tokens=2))


def test_tensor_parallel_ranks_run_under_the_engine_process():
    """The engine process is not a daemon, so it can start its own tensor-parallel workers."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    kw = dict(device="cpu", dtype="float32", max_seq_len=64)
    with LLM("random:tiny-llama", **kw) as one:
        want = [o.outputs[0].token_ids for o in one.generate(PROMPTS[2:], params, use_tqdm=False)]
    with LLM("random:tiny-llama", **kw, tp=2, engine_process=True) as llm:
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS[2:], params, use_tqdm=False)] == want


class FailingStepExecutor(NativeExecutor):
    steps_done = 0

    def complete(self, step):
        FailingStepExecutor.steps_done += 1
        if FailingStepExecutor.steps_done > 3:
            raise RuntimeError("boom in step 4")
        return super().complete(step)


def test_a_failed_step_reaches_the_caller_once_worded_and_close_stays_quick():
    llm = LLM(
        "random:tiny-llama",
        device="cpu",
        max_seq_len=256,
        engine_process=True,
        executor_cls=FailingStepExecutor,
    )
    try:
        handle = llm.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
        out = handle.result(timeout=BOUND_S)
        assert out.error is not None and "RuntimeError: boom in step 4" in out.error
        assert out.error.count("the engine is closed") == 1, out.error
        assert isinstance(llm.core.failure, RuntimeError) and "boom in step 4" in str(llm.core.failure)
        handle.abort()  # the engine is gone: aborting is a no-op, not an error
        with pytest.raises(RuntimeError, match="boom in step 4"):
            llm.generate([[5, 6]], SamplingParams(max_tokens=2), use_tqdm=False)
    finally:
        start = time.monotonic()
        llm.close()
    assert time.monotonic() - start < 15 and llm.core.process.exitcode == 0


def test_a_request_knows_when_it_was_scheduled_and_got_its_first_token(engines):
    for llm in engines:
        handle = llm.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
        handle.result(timeout=BOUND_S)
        scheduled, first = handle.scheduled_at(0), handle.first_token_at(0)
        assert scheduled is not None and first is not None
        assert handle.created <= scheduled <= first <= time.monotonic()


def test_a_message_that_does_not_pickle_is_dropped_and_the_pipe_lives_on():
    import multiprocessing
    import threading

    from fastpath.runtime.engine.core_process import PipeSender

    ours, theirs = multiprocessing.Pipe()
    sender = PipeSender(ours)
    sent = threading.Event()
    sender.put(("add", lambda: None), sent)  # a lambda does not pickle
    sender.put(("stats", 1))
    assert sent.wait(10), "whoever waits on the dropped message is released"
    assert theirs.poll(10) and theirs.recv() == ("stats", 1)
    sender.close()


QUIET_EXIT = """
from fastpath.runtime import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=64, max_batch_size=2, engine_process=True)
    print(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids)
    llm.close()
"""


def test_the_engine_process_exits_without_leak_reports(tmp_path):
    """Its startup heap is frozen out of the collector (engine/heap.py); thawed at exit, so Triton's
    nanobind objects are freed instead of each reported as a leak on stderr."""
    import subprocess
    import sys

    pytest.importorskip("triton")
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_EXIT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "nanobind" not in done.stderr and "leaked" not in done.stderr, done.stderr[-2000:]
