"""The wheelhouse's fastpath-llm wheel for a fastpath installed from a wheel (no checkout to build from)."""

import pytest

from fastpath.compiler import distribution, wheelhouse
from fastpath.compiler.build import BuildError


@pytest.fixture
def installed(monkeypatch):
    """fastpath as a wheel installs it: no source tree, and no package index to download from."""
    monkeypatch.setattr(distribution, "source_tree", lambda: None)

    def offline(out):
        raise BuildError("no index")

    monkeypatch.setattr(wheelhouse, "_download", offline)


def test_a_wheel_the_user_put_into_the_wheelhouse_is_used(installed, tmp_path):
    wheel = tmp_path / f"fastpath_llm-{distribution.version()}-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"PK")
    assert wheelhouse.fastpath_wheel(tmp_path) == wheel


def test_without_one_the_download_is_tried_and_its_failure_says_what_to_do(installed, tmp_path):
    (tmp_path / "fastpath_llm-0.0.0.dev1-py3-none-any.whl").write_bytes(b"PK")  # another version
    with pytest.raises(BuildError, match="no index"):
        wheelhouse.fastpath_wheel(tmp_path)
