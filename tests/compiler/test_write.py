"""write: atomic, write-if-different, removes only what it generated, refuses foreign folders."""

import json
import os
from pathlib import Path

import pytest

from fastpath.compiler.header import MARKER
from fastpath.compiler.write import NotAGeneratedPackage, drift, write_package

HEADER = f"# {MARKER} from templates/x.j2. Do not edit.\n"
LOCK = "pkg/manifest.lock.json"


def package(**extra):
    """A package's files; its lock file lists them, as render() writes it."""
    files = {"pyproject.toml": HEADER + "[project]\n", "pkg/__init__.py": HEADER + "X = 1\n"}
    files.update({k.replace("__", "/"): HEADER + v for k, v in extra.items()})
    files[LOCK] = json.dumps({"_generated": MARKER, "files": sorted([*files, LOCK])}, indent=2) + "\n"
    return files


def age(path: Path, seconds: int = 1000) -> int:
    old = path.stat().st_mtime_ns - seconds * 10**9
    os.utime(path, ns=(old, old))
    return old


def test_a_new_package_appears_whole(tmp_path):
    target = tmp_path / "out" / "m"
    result = write_package(package(), target)
    assert sorted(result.written) == ["pkg/__init__.py", LOCK, "pyproject.toml"]
    assert (target / "pkg" / "__init__.py").read_text() == HEADER + "X = 1\n"
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no staging folder left


def test_unchanged_files_keep_their_mtime_and_changed_ones_are_replaced(tmp_path):
    write_package(package(), tmp_path)
    stamp = age(tmp_path / "pyproject.toml")
    init_stamp = age(tmp_path / "pkg" / "__init__.py")
    files = package()
    files["pkg/__init__.py"] = HEADER + "X = 2\n"
    result = write_package(files, tmp_path)
    assert result.written == ("pkg/__init__.py",) and set(result.unchanged) == {"pyproject.toml", LOCK}
    assert (tmp_path / "pyproject.toml").stat().st_mtime_ns == stamp
    assert (tmp_path / "pkg" / "__init__.py").stat().st_mtime_ns != init_stamp
    assert write_package(files, tmp_path).written == ()


def test_stale_generated_files_go_and_everything_else_stays(tmp_path):
    write_package(package(pkg__old="Y = 1\n", extra__deep__gone="Z = 1\n"), tmp_path)
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / "CMakeCache.txt").write_text(HEADER)  # inside build/: never touched
    (tmp_path / "pkg" / "_hostdispatch.so").write_bytes(b"\x7fELF")  # a build product
    (tmp_path / "notes.txt").write_text("mine\n")  # not generated
    result = write_package(package(), tmp_path)
    assert sorted(result.removed) == ["extra/deep/gone", "pkg/old"]
    assert not (tmp_path / "extra").exists()
    for kept in ["build/CMakeCache.txt", "pkg/_hostdispatch.so", "notes.txt"]:
        assert (tmp_path / kept).exists(), kept


def test_a_folder_that_is_not_a_generated_package_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    with pytest.raises(NotAGeneratedPackage, match="not a generated package"):
        write_package(package(), tmp_path)
    assert (tmp_path / "pyproject.toml").read_text() == "[project]\nname = 'mine'\n"
    file_target = tmp_path / "file"
    file_target.write_text("x")
    with pytest.raises(NotAGeneratedPackage):
        write_package(package(), file_target)


def test_an_empty_folder_is_fine(tmp_path):
    write_package(package(), tmp_path)
    assert (tmp_path / "pyproject.toml").is_file()


@pytest.mark.parametrize("rel", ["../escape.py", "/abs.py", "build/x.py"])
def test_paths_outside_the_package_or_in_build_are_refused(tmp_path, rel):
    with pytest.raises(ValueError):
        write_package({**package(), rel: HEADER}, tmp_path / "m")


def failing_second_write(monkeypatch):
    real = Path.write_bytes
    calls = []

    def write_bytes(self, data):
        calls.append(self)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)


def test_a_failed_update_leaves_the_package_as_it_was(tmp_path, monkeypatch):
    target = tmp_path / "m"
    write_package(package(), target)
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    stamps = {p: age(p) for p in before}
    changed = {rel: text + "# changed\n" for rel, text in package(pkg__new="N = 1\n").items()}
    failing_second_write(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        write_package(changed, target)
    after = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert after == before
    assert {p: p.stat().st_mtime_ns for p in after} == stamps
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_a_failed_first_write_leaves_no_folder(tmp_path, monkeypatch):
    failing_second_write(monkeypatch)
    with pytest.raises(OSError):
        write_package(package(), tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_drift_reports_missing_differing_and_stale_files(tmp_path):
    files = package(pkg__old="Y = 1\n")
    write_package(files, tmp_path)
    assert drift(files, tmp_path) == []
    now = package(pkg__new="N = 1\n")
    now["pyproject.toml"] += "# edited\n"
    kinds = {d.path: d.kind for d in drift(now, tmp_path)}
    assert kinds == {"pyproject.toml": "differs", "pkg/new": "missing", "pkg/old": "stale", LOCK: "differs"}
