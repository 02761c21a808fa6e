"""write: whole packages or nothing, write-if-different, removes only what its lock lists, never
writes through a link or into a special file, refuses foreign folders."""

import json
import os
import signal
from pathlib import Path

import pytest

import fastpath.compiler.write as write_module
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


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def target(tmp_path):
    return tmp_path / "out" / "m"


@pytest.fixture
def no_hang():
    """A FIFO opened for reading blocks forever: fail the test instead."""
    signal.signal(signal.SIGALRM, lambda *_: pytest.fail("hung on a special file"))
    signal.alarm(20)
    yield
    signal.alarm(0)


def test_a_new_package_appears_whole(target):
    result = write_package(package(), target)
    assert sorted(result.written) == ["pkg/__init__.py", LOCK, "pyproject.toml"]
    assert (target / "pkg" / "__init__.py").read_text() == HEADER + "X = 1\n"
    assert oct(target.stat().st_mode & 0o777) == "0o755"
    assert [p.name for p in target.parent.iterdir()] == ["m"]  # no staging folder left


def test_unchanged_files_keep_their_mtime_and_changed_ones_are_replaced(target):
    write_package(package(), target)
    stamp = age(target / "pyproject.toml")
    init_stamp = age(target / "pkg" / "__init__.py")
    files = package()
    files["pkg/__init__.py"] = HEADER + "X = 2\n"
    result = write_package(files, target)
    assert result.written == ("pkg/__init__.py",) and set(result.unchanged) == {"pyproject.toml", LOCK}
    assert (target / "pyproject.toml").stat().st_mtime_ns == stamp
    assert (target / "pkg" / "__init__.py").stat().st_mtime_ns != init_stamp
    assert write_package(files, target).written == ()
    assert [p.name for p in target.parent.iterdir()] == ["m"]


def test_stale_files_the_lock_lists_go_and_everything_else_stays(target):
    write_package(package(pkg__old="Y = 1\n", extra__deep__gone="Z = 1\n"), target)
    (target / "build").mkdir()
    (target / "build" / "CMakeCache.txt").write_text(HEADER)  # inside build/: never touched
    (target / "pkg" / "_hostdispatch.so").write_bytes(b"\x7fELF")  # a build product
    (target / "notes.txt").write_text("mine\n")  # not generated
    (target / "pkg" / "mine.py").write_text(HEADER + "# a user's file that quotes the marker\n")
    (target / "empty").mkdir()  # a user's empty folder
    result = write_package(package(), target)
    assert sorted(result.removed) == ["extra/deep/gone", "pkg/old"]
    assert not (target / "extra").exists() and not (target / "pkg/old").exists()
    for kept in ["build/CMakeCache.txt", "pkg/_hostdispatch.so", "notes.txt", "pkg/mine.py", "empty"]:
        assert (target / kept).exists(), kept


def test_the_in_place_extension_goes_when_its_sources_change_and_only_then(target):
    """A build of other sources must not be imported: once src/ or CMakeLists.txt changes, the
    package says "compiled but not built" until --build builds it again."""
    write_package(package(src__ext__cpp="// mode a\n", pkg__executor__py="A = 1\n"), target)
    built = target / "pkg" / "_hostdispatch.cpython-312-x86_64-linux-gnu.so"
    built.write_bytes(b"\x7fELF")
    other = target / "pkg" / "_other.so"  # another module's build: never ours to drop
    other.write_bytes(b"\x7fELF")
    result = write_package(
        package(src__ext__cpp="// mode a\n", pkg__executor__py="A = 2\n"), target, "pkg/_hostdispatch"
    )
    assert built.exists() and result.removed == (), "the Python side alone changed"
    result = write_package(
        package(src__ext__cpp="// mode b\n", pkg__executor__py="A = 2\n"), target, "pkg/_hostdispatch"
    )
    assert not built.exists() and result.removed == (f"pkg/{built.name}",)
    assert other.exists()


def test_a_file_is_removed_only_if_the_previous_lock_lists_it(target):
    write_package(package(), target)
    (target / "pkg" / "extra.py").write_text(HEADER)  # carries the marker, but no lock lists it
    lock = json.loads((target / LOCK).read_text())
    lock["files"] += ["../../escape", "/etc/passwd"]  # a lock never names a path outside
    (target / LOCK).write_text(json.dumps(lock))
    (target.parent / "escape").write_text("outside\n")
    write_package(package(pkg__new="N = 1\n"), target)
    assert (target / "pkg" / "extra.py").is_file() and (target.parent / "escape").is_file()


def test_a_folder_that_is_not_a_generated_package_is_refused(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        f"# {MARKER}\n[project]\nname = 'mine'\n"
    )  # a marker is not a lock
    with pytest.raises(NotAGeneratedPackage, match="not a generated package"):
        write_package(package(), tmp_path)
    assert (tmp_path / "pyproject.toml").read_text().endswith("name = 'mine'\n")
    file_target = tmp_path / "file"
    file_target.write_text("x")
    with pytest.raises(NotAGeneratedPackage):
        write_package(package(), file_target)


def test_an_empty_folder_is_fine(target):
    target.mkdir(parents=True)
    write_package(package(), target)
    assert (target / "pyproject.toml").is_file()


@pytest.mark.parametrize("rel", ["../escape.py", "/abs.py", "build/x.py"])
def test_paths_outside_the_package_or_in_build_are_refused(target, rel):
    with pytest.raises(ValueError):
        write_package({**package(), rel: HEADER}, target)


def test_a_symlinked_subfolder_is_never_written_through(target, tmp_path):
    write_package(package(), target)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "__init__.py").write_text("theirs\n")
    for path in (target / "pkg").iterdir():
        path.unlink()
    (target / "pkg").rmdir()
    (target / "pkg").symlink_to(outside, target_is_directory=True)
    with pytest.raises(NotAGeneratedPackage, match="symlink"):
        write_package(package(), target)
    assert [p.name for p in outside.iterdir()] == ["__init__.py"]
    assert (outside / "__init__.py").read_text() == "theirs\n"
    assert {d.kind for d in drift(package(), target)} == {"not a regular file"}


def test_the_package_folder_as_a_symlink_is_refused(target, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    target.parent.mkdir(parents=True)
    target.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(NotAGeneratedPackage, match="symlink, not a folder"):
        write_package(package(), target)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_users_symlink_elsewhere_in_the_package_is_kept_as_a_link(target, tmp_path):
    write_package(package(), target)
    (target / "data").symlink_to(tmp_path)
    write_package(package(pkg__new="N = 1\n"), target)
    assert (target / "data").is_symlink() and os.readlink(target / "data") == str(tmp_path)


def test_a_fifo_in_the_way_is_an_error_not_a_hang(target, no_hang):
    write_package(package(), target)
    (target / "pyproject.toml").unlink()
    os.mkfifo(target / "pyproject.toml")
    assert drift(package(), target) == [write_module.Drift("pyproject.toml", "not a regular file")]
    with pytest.raises(
        NotAGeneratedPackage,
        match=r"a special file \(FIFO, socket or device\) stands where the compiler writes",
    ):
        write_package(package(), target)


def test_a_users_fifo_beside_the_files_is_left_alone(target, no_hang):
    write_package(package(), target)
    os.mkfifo(target / "pipe")
    write_package(package(pkg__new="N = 1\n"), target)
    assert (target / "pipe").exists() and not (target / "pipe").is_file()


def failing_second_write(monkeypatch):
    real = write_module.write_file
    calls = []

    def write_file(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(write_module, "write_file", write_file)


def test_a_failed_update_leaves_the_package_as_it_was(target, monkeypatch):
    write_package(package(), target)
    before = tree(target)
    stamps = {p: age(p) for p in target.rglob("*") if p.is_file()}
    changed = {rel: text + "# changed\n" for rel, text in package(pkg__new="N = 1\n").items()}
    failing_second_write(monkeypatch)
    with pytest.raises(OSError, match="No space"):
        write_package(changed, target)
    assert tree(target) == before
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert sorted(p.name for p in target.parent.iterdir()) == ["m"]


def test_a_failed_first_write_leaves_no_folder(target, monkeypatch):
    failing_second_write(monkeypatch)
    with pytest.raises(OSError):
        write_package(package(), target)
    assert list(target.parent.iterdir()) == []


def test_leftovers_of_killed_runs_are_cleaned_and_a_cut_swap_is_undone(target):
    write_package(package(), target)
    out = target.parent
    (out / ".m.abc123.staging" / "pkg").mkdir(parents=True)  # killed while staging
    (out / ".other.x_9.staging").mkdir()
    write_package(package(), target)  # nothing to write, and still cleaned
    assert sorted(p.name for p in out.iterdir()) == ["m"]
    # Killed between the two renames of a swap without renameat2: the old package is put back.
    target.rename(out / ".m.q1w2e3.old")
    write_package(package(), out / "n")
    assert tree(target) == tree(out / "n") and sorted(p.name for p in out.iterdir()) == ["m", "n"]


def test_drift_reports_missing_differing_and_stale_files(target):
    files = package(pkg__old="Y = 1\n")
    write_package(files, target)
    assert drift(files, target) == []
    now = package(pkg__new="N = 1\n")
    now["pyproject.toml"] += "# edited\n"
    kinds = {d.path: d.kind for d in drift(now, target)}
    assert kinds == {"pyproject.toml": "differs", "pkg/new": "missing", "pkg/old": "stale", LOCK: "differs"}


def test_drift_reports_python_files_the_compiler_did_not_write_in_the_package(target):
    """The wheel takes the package's whole folder, so a stray module would ship; caches and build
    outputs would not be reported."""
    files = package()
    write_package(files, target)
    (target / "pkg/extra.py").write_text("import os\n")
    (target / "pkg/sub").mkdir()
    (target / "pkg/sub/deep.py").write_text("")
    (target / "pkg/__pycache__").mkdir()
    (target / "pkg/__pycache__/x.py").write_text("")
    (target / "pkg/_host.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (target / "build").mkdir()
    (target / "build/gen.py").write_text("")  # outside the Python package: not shipped
    kinds = {d.path: d.kind for d in drift(files, target)}
    assert kinds == {
        p: "not generated, and the wheel would ship it: remove it"
        for p in ("pkg/extra.py", "pkg/sub/deep.py")
    }
