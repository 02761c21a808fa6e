import pytest
from compile_helpers import ALL_HOOKS, compile_text


@pytest.fixture
def all_hooks():
    """(plan, files) of a manifest that declares every hook."""
    return compile_text(ALL_HOOKS)
