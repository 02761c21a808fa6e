"""The L2 prefetch hint on the CPU: how a layer's budget is split over the weights read next, the model
asking for o_proj's and gate_up's weights once q|k|v is written and joining the branch once a forward,
the kernel built for the H200 with nvcc, and TritonOps doing nothing off CUDA."""

import shutil
import subprocess

import pytest
import torch

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.kernels import TorchOps, l2_prefetch

NVCC = shutil.which("nvcc")
MB = 1 << 20


def _weight(rows: int, cols: int = 1024) -> torch.Tensor:
    return torch.zeros(rows, cols, dtype=torch.bfloat16)


def test_the_first_group_whole_then_the_next_shares_what_is_left():
    o, gate_up = _weight(2048), _weight(8192)  # 4 MB, and 16 MB in two halves
    gate, up = gate_up.chunk(2)
    ranges = l2_prefetch.plan(((o,), (gate, up)), 12 * MB)
    assert ranges == [(o.data_ptr(), 4 * MB), (gate.data_ptr(), 4 * MB), (up.data_ptr(), 4 * MB)]


def test_a_budget_under_the_first_weight_asks_for_its_front_only():
    o, w = _weight(2048), _weight(4096)
    assert l2_prefetch.plan(((o,), (w,)), MB + 5) == [(o.data_ptr(), MB)]


def test_a_weight_smaller_than_its_share_is_asked_for_whole():
    small, big = _weight(1, 24), _weight(4096)  # 48 bytes
    ranges = l2_prefetch.plan(((small, big),), 2 * MB)
    assert ranges == [(small.data_ptr(), 48), (big.data_ptr(), MB)]


def test_ranges_are_multiples_of_16_bytes_and_at_most_four():
    weights = [_weight(3, 8) for _ in range(6)]  # 48 bytes each
    ranges = l2_prefetch.plan((tuple(weights),), 6 * 40)  # shares of 40 bytes
    assert len(ranges) == 4 and all(size == 32 for _, size in ranges)
    assert l2_prefetch.plan(((_weight(8),),), 15) == []
    assert l2_prefetch.plan(((_weight(8),),), 0) == []


def test_a_strided_weight_is_refused_by_its_shape():
    with pytest.raises(ValueError, match=r"shape \(16, 8\) is not contiguous"):
        l2_prefetch.plan(((_weight(16, 16)[:, :8],),), MB)


class RecordingOps(TorchOps):
    """TorchOps that says it prefetches and records what the model asks for, in order."""

    prefetches_l2 = True

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def prefetch_l2(self, rows, groups):
        self.calls.append(("prefetch", rows, groups))

    def join_prefetches(self):
        self.calls.append(("join",))


def test_each_layer_asks_for_o_proj_then_gate_and_up_and_a_forward_joins_once(tiny_text_checkpoint):
    llm = LLM(str(tiny_text_checkpoint), device="cpu", max_model_len=64, max_num_seqs=2)
    try:
        model = llm.executor.runner.model
        plain = llm.generate(["the cat"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        model.ops = recording = RecordingOps()
        hinted = llm.generate(["the cat"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    finally:
        llm.close()
    assert hinted[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    layers = len(model.layers)
    joins = [i for i, call in enumerate(recording.calls) if call[0] == "join"]
    assert len(joins) >= 4  # a prefill and the decode steps
    start = 0
    for end in joins:  # every forward: one request a layer, in layer order, then the join
        asked = recording.calls[start:end]
        assert len(asked) == layers and len({rows for _, rows, _ in asked}) == 1
        for layer, (_, _, groups) in zip(model.layers, asked, strict=True):
            (o,), (gate, up) = groups
            w = layer.mlp.gate_up_proj.weight
            assert o is layer.self_attn.o_proj.weight
            assert (gate.data_ptr(), up.data_ptr()) == (w.data_ptr(), w[w.shape[0] // 2 :].data_ptr())
            assert gate.shape == up.shape == (w.shape[0] // 2, w.shape[1])
        start = end + 1
    assert [call[1] for call in recording.calls if call[0] == "prefetch"][-1] == 1  # a decode step's one row


def test_the_base_ops_ask_for_nothing():
    ops = TorchOps()
    assert not ops.prefetches_l2
    ops.prefetch_l2(1, ((_weight(8),),))
    ops.join_prefetches()


def test_triton_ops_skip_tensors_off_cuda(monkeypatch):
    pytest.importorskip("triton")
    from fastpath.runtime.kernels.triton_ops import TritonOps

    monkeypatch.setattr(l2_prefetch, "BUDGET_BYTES", 8 * MB)
    ops = TritonOps()
    assert ops.prefetches_l2
    ops.prefetch_l2(1, ((_weight(8),),))  # CPU tensors: no stream, no launch
    assert ops._prefetch_stream is None and not ops._prefetching
    ops.join_prefetches()


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
def test_the_kernel_builds_for_sm90_as_bulk_prefetches_without_spills(tmp_path):
    ptx = tmp_path / "p.ptx"
    done = subprocess.run(
        [NVCC, "-arch=sm_90", "-ptx", "-o", str(ptx), str(l2_prefetch.SOURCE)], capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
    text = ptx.read_text()
    assert "cp.async.bulk.prefetch.L2.global" in text
    assert "ld.global" not in text and "st.global" not in text  # it asks; it never reads or writes
    cubin = subprocess.run(
        [
            NVCC,
            "-arch=sm_90",
            "-cubin",
            "-Xptxas",
            "-v",
            "-o",
            str(tmp_path / "p.cubin"),
            str(l2_prefetch.SOURCE),
        ],
        capture_output=True,
        text=True,
    )
    assert cubin.returncode == 0 and "0 bytes spill stores, 0 bytes spill loads" in cubin.stderr
