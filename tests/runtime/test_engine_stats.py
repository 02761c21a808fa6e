"""The engine's step accounting splits each step into waiting for the device and host work, so a bench
or a dashboard can tell a host-bound engine from a device-bound one."""

import time

from fastpath.runtime import LLM, SamplingParams

WAIT_S = 0.004


def test_time_waiting_for_the_device_is_counted_apart_from_host_work():
    llm = LLM("random:tiny-llama", device="cpu", max_seq_len=128, max_batch_size=4)
    try:
        readback = llm.executor.readback
        plain = readback.wait

        def slow_device(ticket, event):  # as if each step's tokens arrived WAIT_S late
            time.sleep(WAIT_S)
            plain(ticket, event)

        before = llm.stats()
        readback.wait = slow_device
        llm.generate([[5, 6, 7]] * 2, SamplingParams(max_tokens=12, ignore_eos=True))
        after = llm.stats()
    finally:
        llm.close()
    steps = after.steps["decode"] - before.steps["decode"]
    waited = after.step_wait_seconds["decode"] - before.step_wait_seconds["decode"]
    seconds = after.step_seconds["decode"] - before.step_seconds["decode"]
    assert steps >= 10
    assert steps * WAIT_S <= waited < seconds, (steps, waited, seconds)
    assert after.step_wait_seconds["prefill"] >= WAIT_S  # every phase has its own tally
