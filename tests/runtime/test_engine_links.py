"""Links into one engine process (`LLM.open_link`, `LLM.attach`): what the API servers of
`fastpath serve --api-server-count N` stand on. Each link's requests and outputs are its own; a link
that closes ends its requests and frees their blocks; only the owner closes the engine."""

import threading
import time

import pytest

from fastpath.runtime import LLM, EngineClosedError, SamplingParams

BOUND_S = 60
OPTIONS = dict(device="cpu", max_seq_len=128, max_batch_size=8, guided_backend="auto")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def owner(tiny_text_checkpoint):
    with LLM(str(tiny_text_checkpoint), **OPTIONS, engine_process=True) as llm:
        yield llm


def attach(owner: LLM, index: int) -> LLM:
    return LLM.attach(owner.recipe, *owner.open_link(), index)


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_linked_clients_share_the_batch_and_get_their_own_tokens(owner):
    prompts = [[5 + i, 17, 9 + i] for i in range(8)]
    solo = [o.outputs[0].token_ids for o in owner.generate(prompts, GREEDY, use_tqdm=False)]
    first, second = attach(owner, 1), attach(owner, 2)
    got: dict[int, list[int]] = {}

    def caller(llm: LLM, i: int) -> None:
        got[i] = llm.generate([prompts[i]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids

    clients = [owner, first, second]
    threads = [threading.Thread(target=caller, args=(clients[i % 3], i)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(BOUND_S)
    first.close()
    second.close()
    assert [got.get(i) for i in range(len(prompts))] == solo


def test_seeded_sampling_through_a_link_equals_the_owners(owner):
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=11, n=2, max_tokens=8, ignore_eos=True)
    linked = attach(owner, 3)
    try:
        mine = linked.generate(["One, two, three,"], params, use_tqdm=False)[0]
    finally:
        linked.close()
    theirs = owner.generate(["One, two, three,"], params, use_tqdm=False)[0]
    assert [c.token_ids for c in mine.outputs] == [c.token_ids for c in theirs.outputs]
    assert [c.text for c in mine.outputs] == [c.text for c in theirs.outputs]


def test_unseeded_sampling_differs_between_links(owner):
    """Each API server counts its requests from 0: its index must still move their seeds."""
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    links = [attach(owner, k) for k in (6, 7)]
    try:
        got = [llm.generate([[5, 6, 7]], params, use_tqdm=False)[0].outputs[0].token_ids for llm in links]
    finally:
        for llm in links:
            llm.close()
    assert got[0] != got[1]


def test_a_link_that_closes_ends_its_requests_and_frees_their_blocks(owner):
    total = owner.stats().kv_blocks_total
    linked = attach(owner, 4)
    handle = linked.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    wait_for(lambda: owner.stats().running == 1, "the linked request to run")
    linked.close()
    out = handle.result(timeout=BOUND_S)
    assert out.finished and "close() was called" in out.error
    wait_for(lambda: owner.stats().kv_blocks_free == total, "the blocks to be freed")
    stats = owner.stats()
    assert (stats.running, stats.waiting) == (0, 0)
    # the engine goes on for its owner
    assert len(owner.generate([[5, 6]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids) == 8


def test_only_the_owner_opens_links_and_indexes_are_checked(owner):
    linked = attach(owner, 5)
    try:
        with pytest.raises(RuntimeError, match="an engine process this LLM started"):
            linked.open_link()
        with pytest.raises(RuntimeError, match="only the client that started"):
            linked.core.open_link()
    finally:
        linked.close()
    for bad in (0, -1, True, 1 << 20, "1"):
        with pytest.raises(ValueError, match="index must be"):
            LLM.attach(owner.recipe, None, {}, bad)


def test_an_in_process_engine_has_no_recipe_to_attach_to(tiny_text_checkpoint):
    with LLM(str(tiny_text_checkpoint), **OPTIONS) as llm:
        assert llm.recipe is None and llm.engine_pid is None
        with pytest.raises(RuntimeError, match="engine_process=True"):
            llm.open_link()


def test_the_owners_close_ends_the_linked_clients(tiny_text_checkpoint):
    owner = LLM(str(tiny_text_checkpoint), **OPTIONS, engine_process=True)
    linked = attach(owner, 1)
    handle = linked.submit([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=100, ignore_eos=True))
    wait_for(lambda: owner.stats().running == 1, "the linked request to run")
    owner.close()
    out = handle.result(timeout=BOUND_S)
    assert out.finished and out.error is not None
    with pytest.raises(EngineClosedError):
        linked.submit([5, 6], GREEDY)
    linked.close()
