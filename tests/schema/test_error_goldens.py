"""Golden error messages for the common mistakes: each golden/<case>.yaml has its golden/<case>.err.

To accept new messages after a deliberate change: FASTPATH_UPDATE_GOLDEN=1 pytest tests/schema
"""

import os
from pathlib import Path

import pytest

from fastpath.schema import ManifestError, load_manifest
from fastpath.schema.yaml_source import MAX_BYTES

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("FASTPATH_UPDATE_GOLDEN") == "1"
CASES = sorted(p.stem for p in GOLDEN.glob("*.yaml"))


def errors_of(manifest: str) -> str:
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest)
    return str(caught.value) + "\n"


def check_golden(case: str, actual: str) -> None:
    expected_file = GOLDEN / f"{case}.err"
    if UPDATE:
        expected_file.write_text(actual, encoding="utf-8")
    assert expected_file.is_file(), f"no golden for {case}; create it with FASTPATH_UPDATE_GOLDEN=1"
    expected = expected_file.read_text(encoding="utf-8")
    assert actual == expected, (
        f"error messages for {case} changed; if intended, rerun with FASTPATH_UPDATE_GOLDEN=1\n"
        f"--- expected\n{expected}--- actual\n{actual}"
    )


@pytest.mark.parametrize("case", CASES)
def test_error_messages_match_their_golden(case, monkeypatch):
    monkeypatch.chdir(GOLDEN)  # messages name the file as given: "<case>.yaml:line:col"
    check_golden(case, errors_of(f"{case}.yaml"))


def test_every_golden_has_its_manifest():
    orphans = sorted(p.name for p in GOLDEN.glob("*.err") if p.stem not in {*CASES, "too_large"})
    assert not orphans, f"goldens without a manifest: {orphans}"


def test_a_file_over_one_mib_is_refused_before_parsing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("too_large.yaml").write_text("schema_version: 1\n" + "#" * MAX_BYTES + "\n", encoding="utf-8")
    check_golden("too_large", errors_of("too_large.yaml"))


def test_every_message_reads_file_line_col_error():
    for case in CASES:
        for line in (GOLDEN / f"{case}.err").read_text(encoding="utf-8").splitlines():
            file, line_no, col, rest = line.split(":", 3)
            assert file == f"{case}.yaml" and line_no.isdigit() and col.isdigit(), line
            assert rest.startswith(" error: "), line
