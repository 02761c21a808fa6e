"""bench/lora.py runs end to end (on the CPU, a tiny model) and reports every case at every batch."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_lora_bench_times_every_case(tmp_path):
    cmd = [sys.executable, str(ROOT / "bench" / "lora.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "lora-quick.json").read_text())
    assert list(report["cases"]) == [
        "LoRA off",
        "LoRA on, no adapter",
        "LoRA on, one adapter",
        "LoRA on, two adapters",
    ]
    for case in report["cases"].values():
        assert sorted(map(int, case["median_us"])) == [2, 4]
        assert all(len(times) == 2 and min(times) > 0 for times in case["step_us"].values())
    assert "LoRA on, two adapters" in (tmp_path / "lora-quick.md").read_text()
