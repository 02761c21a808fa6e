"""bench/step_timeline.py's trace arithmetic, on made-up device operations (the bench itself needs a GPU)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from step_timeline import Op, kernel_deltas, loop_graphs, middle, replay_graphs, span_and_busy


def _step(t0: float, attn_us: float) -> list[Op]:
    """One engine step: the unpack kernel, then a graph of three kernels (attention `attn_us` long)."""
    return [
        Op(t0, t0 + 2, "unpack", "decode_unpack"),
        Op(t0 + 3, t0 + 13, "kernel", "gemv"),
        Op(t0 + 13, t0 + 13 + attn_us, "kernel", "attention"),
        Op(t0 + 14 + attn_us, t0 + 20 + attn_us, "kernel", "argmax"),
    ]


def test_the_loop_and_the_replays_are_cut_into_graphs_and_compared_kernel_by_kernel():
    ops = [op for i in range(9) for op in _step(100.0 * i, 30.0)]
    loop = loop_graphs(ops)
    assert [len(g) for g in loop] == [3] * 8  # the last step has no unpack after it
    replayed = [Op(t, t + 10, "kernel", "gemv") for t in (0, 50, 100)]
    replayed += [Op(t + 10, t + 30, "kernel", "attention") for t in (0, 50, 100)]
    replayed += [Op(t + 30, t + 36, "kernel", "argmax") for t in (0, 50, 100)]
    replayed.append(Op(300, 301, "memset"))
    alone = replay_graphs(replayed, 3)
    assert [[o.name for o in g] for g in alone] == [["gemv", "attention", "argmax"]] * 3
    assert span_and_busy(loop[0]) == (47.0, 46.0)  # one µs idle between attention and argmax
    assert span_and_busy(alone[0]) == (36.0, 36.0)
    # Replayed in another kernel order than the loop's: compared by name, not launch by launch.
    deltas = kernel_deltas(middle(loop, 3), sorted(replayed, key=lambda o: o.name), 3)
    assert deltas[0]["kernel"] == "attention" and deltas[0]["grown_us"] == 10.0
    assert deltas[0]["launches"] == deltas[0]["launches_alone"] == 1
    assert {d["kernel"]: d["grown_us"] for d in deltas[1:]} == {"gemv": 0.0, "argmax": 0.0}
