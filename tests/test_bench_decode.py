"""bench/decode.py runs end to end (on the CPU, a tiny model) and its report holds every column it promises."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_decode_bench_reports_steps_floors_sampling_cost_and_long_contexts(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "decode.py"), "--device", "cpu", "--model", "random:tiny-llama",
           "--quick", "--batch", "1", "2", "--variants", "torch-ops", "--long-context", "200", "--alternate", "2", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "decode.json").read_text())
    rows = report["rows"]
    short = [r for r in rows if r["context"] < 200]
    assert {(r["batch"], r["sampling"]) for r in short} == {
        (1, "greedy"),
        (1, "penalties"),
        (2, "greedy"),
        (2, "penalties"),
    }
    for r in rows:
        assert r["step_s"] > 0 and r["diff_step_s"] > 0 and len(r["counted_mean_step_s"]) == 3
        assert r["floor_step_s"] > 0 and r["share_of_floor"] > 0
        assert 0 < r["host_step_s"] <= r["step_s"] * 1.5  # a difference of two runs: noise, but no more
        assert r["replay_s"] is None  # no graphs on the CPU: no replay column invented
    sampled = [r for r in short if r["sampling"] == "penalties"]
    assert all(r["vs_greedy"] is not None for r in sampled)
    (long_row,) = [r for r in rows if r["context"] >= 200]
    assert long_row["batch"] == 8 and long_row["kv_bytes"] > max(r["kv_bytes"] for r in short)
    alternating = report["alternating"]  # with no package: native against a second native engine
    assert [(a["batch"], len(a["steps_s"]), len(a["native_steps_s"])) for a in alternating] == [
        (1, 2, 2),
        (2, 2, 2),
    ]
    table = (tmp_path / "decode.md").read_text()
    assert "floor µs" in table and "host µs" in table and "200-token contexts" in table
    # which kernels ran is in the report: a GPU kernel that fails to build falls back silently
    assert report["kernels"] == {"native (torch-ops)": "plain torch ops"}
    assert "native (torch-ops): plain torch ops." in table
