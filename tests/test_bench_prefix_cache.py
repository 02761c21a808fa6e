"""bench/prefix_cache.py runs end to end (on the CPU, a tiny model) and reports both engines and the hits."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_prefix_cache_bench_times_both_engines_and_counts_the_hits(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "prefix_cache.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "prefix-cache-quick.json").read_text())
    assert [r["prompts"] for r in report["rows"]] == [1, 4]
    for r in report["rows"]:
        assert r["off_s"] > 0 and r["on_s"] > 0 and r["speedup"] == r["off_s"] / r["on_s"]
    # Each timed request finds the system prompt's whole blocks (96 tokens: 6 blocks).
    timed = 3 * (1 + 4)
    assert report["hits"] >= timed * 96 and report["hits"] < report["queries"]
    # float32 on the CPU: the cache leaves every greedy token, of both turns, as the uncached engine's.
    agreement = report["agreement"]
    assert agreement["tokens"] > 0
    assert agreement["first_turn_equal"] == agreement["next_turn_equal"] == agreement["tokens"]
    assert "off / on" in (tmp_path / "prefix-cache-quick.md").read_text()
