"""The switch interval the engine and server processes run with (runtime/engine/gil.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from fastpath.runtime.engine.gil import ENV, SWITCH_INTERVAL_S, prompt_handoffs


@pytest.fixture(autouse=True)
def _restore_interval(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_the_default_shortens_cpythons_interval():
    assert prompt_handoffs() == pytest.approx(SWITCH_INTERVAL_S, rel=0.01)
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S, rel=0.01)


def test_a_shorter_interval_already_set_is_kept():
    sys.setswitchinterval(SWITCH_INTERVAL_S / 5)
    assert prompt_handoffs() == pytest.approx(SWITCH_INTERVAL_S / 5, rel=0.01)


def test_the_environment_sets_it_and_zero_leaves_cpythons(monkeypatch):
    monkeypatch.setenv(ENV, "200")
    assert prompt_handoffs() == pytest.approx(200e-6, rel=0.01)
    sys.setswitchinterval(0.005)
    monkeypatch.setenv(ENV, "0")
    assert prompt_handoffs() == pytest.approx(0.005, rel=0.01)


@pytest.mark.parametrize("raw", ["fast", "-3"])
def test_a_bad_value_is_named_and_the_default_used(monkeypatch, caplog, raw):
    monkeypatch.setenv(ENV, raw)
    with caplog.at_level(logging.WARNING, logger="fastpath.engine"):
        assert prompt_handoffs() == pytest.approx(SWITCH_INTERVAL_S, rel=0.01)
    assert ENV in caplog.text and repr(raw) in caplog.text
