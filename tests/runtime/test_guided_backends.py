"""Which backend an engine gets: "auto" takes the first installed and says so once; a backend named
outright that cannot run is a construction error that says how to install it."""

import logging
import sys

import pytest

from fastpath.runtime.guided import backends
from fastpath.runtime.guided.backends import install_line, off_message, resolve_backend


@pytest.fixture
def hide(monkeypatch):
    """hide("xgrammar") makes `import xgrammar` fail, as on a machine without it."""
    monkeypatch.setattr(backends, "_announced", set())
    return lambda *names: [monkeypatch.setitem(sys.modules, n, None) for n in names]


def test_auto_takes_xgrammar_first(hide):
    pytest.importorskip("xgrammar")
    assert resolve_backend("auto", has_tokenizer=True)[0] == "xgrammar"


def test_auto_takes_llguidance_without_xgrammar(hide):
    pytest.importorskip("llguidance")
    hide("xgrammar")
    assert resolve_backend("auto", has_tokenizer=True)[0] == "llguidance"


def test_auto_without_either_is_off_and_names_the_pip_line(hide, caplog):
    hide("xgrammar", "llguidance")
    with caplog.at_level(logging.INFO, logger="fastpath.guided"):
        backend, reason = resolve_backend("auto", has_tokenizer=True)
        resolve_backend("auto", has_tokenizer=True)
    assert backend == "none"
    assert reason == f"neither xgrammar nor llguidance is installed: {install_line()}"
    assert install_line() == "pip install 'fastpath-llm[guided]'", (
        "the distribution's own name, never 'fastpath'"
    )
    assert [r.getMessage() for r in caplog.records] == [f"guided decoding: none ({reason})"], "said once"
    assert off_message(reason).startswith("guided decoding is off in this engine: neither")


def test_auto_says_which_backend_once(hide, caplog):
    pytest.importorskip("xgrammar")
    with caplog.at_level(logging.INFO, logger="fastpath.guided"):
        for _ in range(3):
            resolve_backend("auto", has_tokenizer=True)
    assert [r.getMessage() for r in caplog.records] == [
        "guided decoding: xgrammar (auto: the first of xgrammar, llguidance that is installed)"
    ]


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"has_tokenizer": False}, "guided decoding needs the model's tokenizer, and this model has none"),
        (
            {"has_tokenizer": True, "tensor_parallel_size": 2},
            "guided decoding with tensor_parallel_size > 1 is not supported yet",
        ),
    ],
    ids=["no tokenizer", "tensor parallel"],
)
def test_an_engine_that_cannot_guide_is_off_under_auto_silently_and_an_error_when_named(
    hide, caplog, kwargs, reason
):
    with caplog.at_level(logging.INFO, logger="fastpath.guided"):
        assert resolve_backend("auto", **kwargs) == ("none", reason)
    assert caplog.records == []
    for name in ("xgrammar", "llguidance"):
        pytest.importorskip(name)
        with pytest.raises(ValueError, match=rf"^guided_backend='{name}': {reason}$"):
            resolve_backend(name, **kwargs)


@pytest.mark.parametrize("name", ["xgrammar", "llguidance"])
def test_a_named_backend_that_is_not_installed_says_how_to_install_it(hide, name):
    hide(name)
    with pytest.raises(ValueError, match=rf"guided_backend='{name}': {name} does not import .*; pip install"):
        resolve_backend(name, has_tokenizer=True)


def test_none_and_unknown_names(hide):
    backend, reason = resolve_backend("none", has_tokenizer=True)
    assert backend == "none" and "guided_backend='auto'" in reason and install_line() in reason
    with pytest.raises(
        ValueError, match=r"guided_backend: 'outlines' is not one of auto, none, xgrammar, llguidance"
    ):
        resolve_backend("outlines", has_tokenizer=True)
