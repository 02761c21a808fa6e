"""Concurrent and killed compiles never leave a torn package, nor staging folders after the next run.

A torn package is one that is neither missing nor exactly one compile's files: --check would
pass for no manifest, or worse, pass for one while holding another's files.
"""

import multiprocessing
import random
import time

import pytest
from compile_helpers import compile_text

import fastpath.compiler.write as write_module
from fastpath.compiler.write import drift, write_package

# Four manifests of one name whose packages differ in every file the compiler renders from them.
VARIANTS = [
    compile_text(
        f"schema_version: 1\nname: racer\nmodel: {{checkpoint: 'random:tiny-llama', seed: {i}}}\n"
        f"host_dispatch: {{mode: {mode}}}\nruntime: {{max_batch_size: {2 + i}}}\n"
    )[1]
    for i, mode in enumerate(["blocking", "spin", "auto", "spin"])
]
FORK = multiprocessing.get_context("fork")
DELAY_S = 0.02  # per file, so that a kill lands mid-write


def package_state(folder):
    """'missing', or the index of the variant the folder holds exactly; None for a torn package."""
    if not folder.exists():
        return "missing"
    on_disk = {
        p.relative_to(folder).as_posix(): p.read_text()
        for p in folder.rglob("*")
        if p.is_file() and "build" not in p.relative_to(folder).parts
    }
    matches = [i for i, files in enumerate(VARIANTS) if on_disk == files]
    passes_check = [i for i, files in enumerate(VARIANTS) if drift(files, folder) == []]
    assert passes_check == matches, "--check passes for a package that differs from a clean compile"
    return matches[0] if len(matches) == 1 else None


def write_variant(index, folder, delay_s=0.0, writing=None):
    if delay_s:  # slow every file down, so that a kill lands mid-write
        real = write_module.write_file

        def slow(path, data):
            if writing is not None:
                writing.set()
            time.sleep(delay_s)
            real(path, data)

        write_module.write_file = slow
    write_package(VARIANTS[index], folder)


def staging_leftovers(out):
    return [p.name for p in out.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_concurrent_compiles_of_one_name_leave_one_whole_package(tmp_path):
    folder = tmp_path / "out" / "racer"
    for _ in range(12):
        runs = [FORK.Process(target=write_variant, args=(i, folder)) for i in range(len(VARIANTS))]
        for run in runs:
            run.start()
        for run in runs:
            run.join(60)
            assert run.exitcode == 0
        assert package_state(folder) in range(len(VARIANTS))
        assert staging_leftovers(folder.parent) == []


@pytest.mark.slow
def test_killed_compiles_never_leave_a_torn_package_and_the_next_run_cleans_up(tmp_path):
    folder = tmp_path / "out" / "racer"
    write_package(VARIANTS[0], folder)
    rng = random.Random(15)
    states, cut_short = [], 0
    files = len(VARIANTS[0])
    for trial in range(30):
        writing = FORK.Event()
        run = FORK.Process(target=write_variant, args=(trial % len(VARIANTS), folder, DELAY_S, writing))
        run.start()
        # Timed from the first file, not from the fork, so a loaded machine's slow start-up
        # cannot push every kill past the end; a package already on disk writes nothing.
        deadline = time.monotonic() + 60
        while not writing.wait(0.01) and run.is_alive():
            assert time.monotonic() < deadline, f"trial {trial}: the compile never started writing"
        time.sleep(rng.uniform(0.0, 1.3 * files * DELAY_S))
        run.kill()  # SIGKILL; a no-op for a run that already ended
        run.join(10)
        states.append(package_state(folder))
        assert states[-1] is not None, f"trial {trial}: a torn package"
        cut_short += bool(staging_leftovers(folder.parent))  # killed mid-write; the next run cleans it
    assert cut_short >= 3, "too few kills landed mid-write to test anything"
    assert len(set(states)) > 1, "no kill landed after a swap"
    write_package(VARIANTS[1], folder)
    assert staging_leftovers(folder.parent) == []
    assert package_state(folder) == 1
