"""The wheelhouse's fastpath-llm wheel for a fastpath installed from a wheel (no checkout to build from)."""

import subprocess
from pathlib import Path

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


def test_a_relative_wheelhouse_gets_the_wheel_built_in_the_checkout(tmp_path, monkeypatch):
    """The build runs in fastpath's checkout; a wheelhouse named relative to the user's folder (`-o
    out`) must still receive the wheel, and nothing may land in the checkout."""
    checkout, user = tmp_path / "checkout", tmp_path / "user"
    checkout.mkdir(), user.mkdir()
    monkeypatch.setattr(distribution, "source_tree", lambda: checkout)
    monkeypatch.chdir(user)

    def build(command, cwd, **kw):  # a build writes the wheel into the folder it was given, from cwd
        out = Path(cwd) / next(a for a in command if ".fastpath-wheel." in a)
        (out / f"fastpath_llm-{distribution.version()}-py3-none-any.whl").write_bytes(b"PK")
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(wheelhouse.subprocess, "run", build)
    got = wheelhouse.fastpath_wheel(Path("out/dist"))
    assert got == user / "out/dist" / got.name and got.is_file()
    assert not any(p.suffix == ".whl" for p in checkout.rglob("*"))
