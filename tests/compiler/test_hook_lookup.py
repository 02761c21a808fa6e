"""Hook import paths looked up where the manifest is compiled: found, parsed, never imported."""

import sys

import pytest

from fastpath.compiler import hook_lookup
from fastpath.compiler.resolve import resolve
from fastpath.schema import ManifestError, parse_manifest

HEAD = "schema_version: 1\nname: m\nmodel:\n  checkpoint: random:tiny-llama\nhooks:\n"


@pytest.mark.parametrize("imported", [False, True])
def test_a_misspelled_fastpath_hook_is_an_error_at_its_line_with_the_name_it_meant(imported, monkeypatch):
    """The same message whether this process has imported the module (asked) or not (its source read)."""
    if imported:
        import fastpath.runtime.prologues  # noqa: F401
    else:
        monkeypatch.delitem(sys.modules, "fastpath.runtime.prologues", raising=False)
    with pytest.raises(ManifestError) as e:
        resolve(
            parse_manifest(
                HEAD + "  decode_prologue: fastpath.runtime.prologues:FusedDecodePrologu\n", "m.yaml"
            )
        )
    assert str(e.value) == (
        "m.yaml:6:20: error: hook 'fastpath.runtime.prologues:FusedDecodePrologu': fastpath.runtime.prologues "
        "has no 'FusedDecodePrologu'; did you mean 'FusedDecodePrologue'?"
    )
    assert [d.path for d in e.value.diagnostics] == ["hooks.decode_prologue"]


def test_every_bad_hook_is_reported_at_once():
    body = "  executor_events:\n    at_shutdown: [fastpath.runtime.nothere:x, fastpath.runtime.events:nope]\n"
    with pytest.raises(ManifestError) as e:
        resolve(parse_manifest(HEAD + body, "m.yaml"))
    messages = [d.message for d in e.value.diagnostics]
    assert len(messages) == 2
    assert "fastpath has no module 'fastpath.runtime.nothere'" in messages[0]
    assert "fastpath.runtime.events has no 'nope'" in messages[1]


def test_fastpaths_own_hooks_resolve_and_nothing_is_imported():
    before = set(sys.modules)
    plan = resolve(
        parse_manifest(
            HEAD + "  decode_prologue: fastpath.runtime.prologues:FusedDecodePrologue\n"
            "  executor_events: {after_warmup: [fastpath.runtime.events:retain_host_pages]}\n",
            "m.yaml",
        )
    )
    assert plan.hooks.decode_prologue.attr == "FusedDecodePrologue"
    assert not {m for m in set(sys.modules) - before if m.startswith(("fastpath.runtime", "torch"))}


def test_a_module_not_found_here_is_left_to_the_deploy_machine():
    assert hook_lookup.problem("surely_not_installed_pkg.hooks", "Prologue") is None


@pytest.fixture
def user_hooks(tmp_path, monkeypatch):
    pkg = tmp_path / "myhooks_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "defs.py").write_text(
        "import os.path\nfrom json import dumps as to_json\n"
        "try:\n    import fancy\nexcept ImportError:\n    fancy = None\n"
        "if True:\n    class Prologue:\n        pass\nelse:\n    def Prologue():\n        pass\n"
        "(a, [b, c]) = 1, [2, 3]\nCOUNT: int = 0\nasync def on_event(executor):\n    pass\n"
    )
    (pkg / "more.py").write_text(
        "def _setup():\n    global on_warmup\n    on_warmup = print\n_setup()\n"
        "for looped in range(1):\n    pass\nwith open(__file__) as handle:\n    pass\n"
        "match 1:\n    case 1 as matched:\n        pass\n    case {**rest}:\n        pass\n"
        "try:\n    pass\nexcept* ValueError as group:\n    caught = 1\n"
        "if (walrus := 3):\n    pass\n"
    )
    (pkg / "dynamic.py").write_text("globals()['made'] = 1\n")
    (pkg / "swapped.py").write_text("import sys\nsys.modules[__name__] = object()\n")
    (pkg / "lazy_assigned.py").write_text(
        "def attach():\n    return lambda name: name\n__getattr__ = attach()\n"
    )
    (pkg / "lazy_imported.py").write_text("from os import getenv as __getattr__\n")
    (pkg / "star.py").write_text("from os.path import *\n")
    (pkg / "lazy.py").write_text("def __getattr__(name):\n    return name\n")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "myhooks_pkg"
    assert not [m for m in sys.modules if m.startswith("myhooks_pkg")], "a lookup imported the module"


@pytest.mark.parametrize("name", ["Prologue", "to_json", "os", "fancy", "a", "b", "c", "COUNT", "on_event"])
def test_every_way_a_module_binds_a_name_counts(user_hooks, name):
    assert hook_lookup.problem(f"{user_hooks}.defs", name) is None


def test_a_name_the_module_does_not_bind_is_an_error(user_hooks):
    assert hook_lookup.problem(f"{user_hooks}.defs", "Prologu") == (
        "myhooks_pkg.defs has no 'Prologu'; did you mean 'Prologue'?"
    )


@pytest.mark.parametrize("name", ["on_warmup", "looped", "handle", "matched", "rest", "caught", "walrus"])
def test_names_bound_by_globals_loops_withs_matches_and_handlers_count(user_hooks, name):
    assert hook_lookup.problem(f"{user_hooks}.more", name) is None


def test_a_blocked_import_is_left_to_the_deploy_machine(monkeypatch):
    monkeypatch.setitem(sys.modules, "blocked_pkg", None)
    assert hook_lookup.problem("blocked_pkg.hooks", "x") is None
    assert hook_lookup.problem("blocked_pkg", "x") is None


@pytest.mark.parametrize(
    "module", ["star", "lazy", "broken", "dynamic", "swapped", "lazy_assigned", "lazy_imported"]
)
def test_where_the_source_cannot_tell_the_name_is_taken_on_trust(user_hooks, module):
    assert hook_lookup.problem(f"{user_hooks}.{module}", "Anything") is None


def test_a_submodule_named_as_the_attribute_is_found(user_hooks):
    assert hook_lookup.problem(user_hooks, "sub") is None
    assert hook_lookup.problem(user_hooks, "defs") is None
    assert "has no 'nothing'" in hook_lookup.problem(user_hooks, "nothing")
