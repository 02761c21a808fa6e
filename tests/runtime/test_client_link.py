"""An engine process holds a request's compiled constraint from its prepare to its add. A client that
gives up waiting forgets it; whether the forget comes before or after the compile ends, nothing of it
stays behind (a server under a flood of slow compiles would otherwise leak every one)."""

import multiprocessing as mp

import pytest

from fastpath.runtime.engine.core_process import ClientLink


@pytest.fixture
def link():
    ours, theirs = mp.Pipe()
    yield ClientLink(ours, owner=True)
    ours.close()
    theirs.close()


def test_a_forget_before_the_compile_ends_drops_its_states(link):
    link.compiling(1)
    link.forget([1])
    link.keep(1, ["states"])
    assert 1 not in link.prepared


def test_a_forget_after_the_compile_ends_drops_its_states(link):
    link.compiling(2)
    link.keep(2, ["states"])
    assert link.prepared[2] == ["states"]
    link.forget([2])
    assert 2 not in link.prepared


def test_forgetting_what_never_compiled_leaves_nothing_behind(link):
    link.compiling(3)
    link.keep(3, None)  # its prepare failed, or it had no constraint
    link.forget([3, 4])
    link.compiling(5)
    link.keep(5, ["states"])
    assert link.prepared == {5: ["states"]}
    assert not link._forgotten and not link._compiling
