"""What one caller gets wrong stays that caller's: a bad event loop, an object the engine process
cannot take, a task cancelled mid-stream, a fork. The engine keeps serving everyone else."""

import asyncio
import operator
import os
import pickle

import pytest

from fastpath.runtime import LLM, EngineClosedError, SamplingParams

LONG = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0)
SHORT = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
BOUND_S = 120


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "engine-process"])
def llm(request):
    engine = LLM(
        "random:tiny-llama", device="cpu", max_seq_len=64, max_batch_size=8, engine_process=request.param
    )
    yield engine
    engine.close()


def test_a_loop_that_is_no_event_loop_is_refused_and_nothing_else_notices(llm):
    others = [llm.submit([5, 6, 7], LONG) for _ in range(4)]
    with pytest.raises(TypeError, match="loop must be an asyncio event loop, got object"):
        llm.submit([5, 6, 7], SHORT, loop=object())
    for h in others:
        assert len(h.result(timeout=BOUND_S).outputs[0].token_ids) == 40
    assert llm.closed_reason is None


def test_a_cancelled_task_aborts_its_request(llm):
    async def consume(handle):
        async for _ in handle:
            pass

    async def main():
        loop = asyncio.get_running_loop()
        handles = [
            llm.submit([5, 6, 7], SamplingParams(max_tokens=60, ignore_eos=True), loop=loop) for _ in range(3)
        ]
        tasks = [asyncio.create_task(consume(h)) for h in handles]
        await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return handles

    handles = asyncio.run(main())
    for h in handles:
        out = h.result(timeout=BOUND_S)
        assert out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 60
    stats = llm.stats()
    assert stats.running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


def test_leaving_a_handles_iteration_early_aborts_it(llm):
    handle = llm.submit([5, 6, 7], SamplingParams(max_tokens=60, ignore_eos=True))
    for _ in handle:
        break
    out = handle.result(timeout=BOUND_S)
    assert out.outputs[0].finish_reason == "abort" and len(out.outputs[0].token_ids) < 60


def _local_stop():
    class Stop(str):  # a class pickle cannot name
        pass

    return Stop(".")


def test_stop_strings_of_a_str_subclass_become_plain_strs():
    params = SamplingParams(stop=[_local_stop()], bad_words=[_local_stop()])
    assert type(params.stop[0]) is str and type(params.bad_words[0]) is str
    assert pickle.loads(pickle.dumps(params)) == params


@pytest.mark.parametrize(
    "llm", [True], indirect=True, ids=["engine-process"]
)  # in process, nothing is pickled
def test_params_the_engine_process_cannot_take_fail_alone(llm):
    """A params object that does not pickle fails its request at once, and the batch beside it runs."""
    bad = SHORT.clone()
    object.__setattr__(bad, "seed", _Unpicklable())  # past validation, as no caller should
    outs = llm.generate([[5, 6, 7], [5, 6, 7]], [SHORT, bad], errors="return", use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 3
    assert "cannot be sent to the engine process" in outs[1].error


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("not today")


class _BrokenOnLoad:
    """Pickles here; rebuilding it anywhere raises (as a class of the caller's __main__ would there)."""

    def __reduce__(self):
        return (operator.truediv, (1, 0))


@pytest.mark.parametrize("llm", [True], indirect=True, ids=["engine-process"])
def test_a_request_the_engine_process_cannot_rebuild_fails_alone(llm):
    bad = SHORT.clone()
    object.__setattr__(bad, "spaces_between_special_tokens", _BrokenOnLoad())  # read here, as True
    outs = llm.generate([[5, 6, 7], [5, 6, 7]], [SHORT, bad], errors="return", use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 3
    assert "could not rebuild this request (ZeroDivisionError" in outs[1].error
    assert llm.generate([[5, 6, 7]], SHORT, use_tqdm=False)[0].outputs[0].token_ids  # still serving


@pytest.mark.parametrize("llm", [True], indirect=True, ids=["engine-process"])
def test_a_prepared_request_the_engine_process_cannot_rebuild_fails_alone(llm):
    bad = SamplingParams(max_tokens=3, prompt_logprobs=1)  # prompt logprobs go through a prepare first
    object.__setattr__(bad, "spaces_between_special_tokens", _BrokenOnLoad())  # read here, as True
    outs = llm.generate([[5, 6, 7], [5, 6, 7]], [SHORT, bad], errors="return", use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 3
    assert "could not rebuild this request (ZeroDivisionError" in outs[1].error


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_gets_a_clear_error_and_leaves_the_parents_engine_running(llm):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what generate() did, then leave without the parent's exit hooks
        try:
            llm.generate([[5, 6, 7]], SHORT, use_tqdm=False)
            said = b"ran"
        except EngineClosedError as exc:
            said = str(exc).encode()
        except BaseException as exc:
            said = repr(exc).encode()
        llm.close()  # must not stop the parent's engine
        os.write(write, said)
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    said = os.read(read, 4096).decode()
    os.close(read)
    assert status == 0 and "forked" in said, said
    assert len(llm.generate([[5, 6, 7]], SHORT, use_tqdm=False)[0].outputs[0].token_ids) == 3


def test_a_script_without_a_main_guard_is_told_what_it_needs(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "noguard.py"
    script.write_text(
        'from fastpath.runtime import LLM\nLLM("random:tiny-llama", device="cpu", engine_process=True)\n'
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode != 0
    assert 'it needs `if __name__ == "__main__":` around that' in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("llm", [True], indirect=True, ids=["engine-process"])
def test_a_request_that_cannot_be_sent_fails_alone_and_the_batch_runs(llm, monkeypatch):
    """What _admit cannot see (a LoRARequest of the caller's own class, say) fails at the pipe alone."""
    from fastpath.runtime.engine import core_client

    def sealed(body):
        if isinstance(body, tuple) and body[0] == [9, 9, 9]:  # the prompt ids of the request that will not go
            raise ValueError("the request cannot be sent to the engine process: PicklingError: no")
        return real(body)

    real = core_client.sealed
    monkeypatch.setattr(core_client, "sealed", sealed)
    outs = llm.generate([[5, 6, 7], [9, 9, 9], [5, 6, 7]], SHORT, errors="return", use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in (outs[0], outs[2])] == [3, 3]
    assert "cannot be sent to the engine process" in outs[1].error


def test_a_cache_salt_of_a_str_subclass_is_kept_as_its_plain_str():
    from fastpath.runtime.engine.admission import check_cache_salt

    class Salt(str):  # a class pickle cannot name
        pass

    salt = check_cache_salt(Salt("tenant-a"))
    assert type(salt) is str and salt == "tenant-a"


@pytest.mark.parametrize("llm", [True], indirect=True, ids=["engine-process"])
def test_requests_sharing_params_that_cannot_be_rebuilt_fail_and_the_others_run(llm):
    """A batch's shared SamplingParams go over once: all of their requests fail, and only they."""
    bad = SHORT.clone()
    object.__setattr__(bad, "spaces_between_special_tokens", _BrokenOnLoad())  # read here, as True
    outs = llm.generate([[5, 6, 7]] * 4, [bad, SHORT, bad, SHORT], errors="return", use_tqdm=False)
    assert [o.error is None for o in outs] == [False, True, False, True]
    assert all("could not rebuild this request" in outs[i].error for i in (0, 2))
    assert all(len(outs[i].outputs[0].token_ids) == 3 for i in (1, 3))


@pytest.mark.parametrize("engine_process", [False, True], ids=["in-process", "engine-process"])
def test_a_closed_engine_refuses_stats_and_prefix_resets_with_the_reason(engine_process):
    llm = LLM(
        "random:tiny-llama", device="cpu", max_seq_len=64, max_batch_size=2, engine_process=engine_process
    )
    assert llm.stats().running == 0
    llm.close()
    with pytest.raises(EngineClosedError, match="the engine is closed"):
        llm.stats()
    with pytest.raises(EngineClosedError, match="the engine is closed"):
        llm.reset_prefix_cache()
