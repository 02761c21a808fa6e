"""Runs under TRITON_INTERPRET=1 (a subprocess of test_triton_interpreter.py): the GPU kernels on the CPU.

fp16 only: the interpreter's bf16 rounding is not the hardware's, while fp16 goes through numpy exactly.
"""

import os
import sys
from unittest import mock

import torch

from fastpath.runtime.attention import triton_decode
from fastpath.runtime.attention.metadata import AttentionMetadata
from fastpath.runtime.attention.reference import ReferenceAttention
from fastpath.runtime.attention.triton_decode import TritonDecodeAttention
from fastpath.runtime.attention.triton_prefill import TritonPrefillAttention
from fastpath.runtime.kernels.torch_ops import TorchOps
from fastpath.runtime.kernels.triton_ops import TritonOps
from fastpath.runtime.runner.decode_inputs import FIXED_COLUMNS, DecodeBuffers, DecodeInputs, native_prologue

assert os.environ.get("TRITON_INTERPRET") == "1", "run me with TRITON_INTERPRET=1"
DT = torch.float16
g = torch.Generator().manual_seed(0)


def rand(*shape, scale=1.0, gen=None):
    return (torch.randn(*shape, generator=gen or g) * scale).to(DT)


def check(name, ok):
    print(("ok   " if ok else "FAIL ") + name)
    return ok


def ops() -> bool:
    t, f = TorchOps(), TritonOps()
    good = True
    # k=1100: the first tile (loaded before the wait for x's writer), whole tiles, then a partial one.
    # Their own generator: the later checks keep the inputs they had before these cases were added.
    gen = torch.Generator().manual_seed(1)
    for m, k in ((1, 256), (3, 256), (16, 256), (1, 1100), (5, 1100)):
        src = g if k == 256 else gen
        x, w, b = rand(m, k, gen=src), rand(96, k, scale=0.05, gen=src), rand(96, gen=src)
        ref, got = t.linear(x, w, b).float(), f.linear(x, w, b).float()
        # Sums in another order than the CPU GEMM: equal to fp16 rounding, not bit for bit.
        good &= check(f"linear m={m} k={k}", float((ref - got).norm() / ref.norm()) < 1e-3)
    # Past 16 rows, and split-K: 1100 columns in 5 tiles of 256 over 2 or 4 ranges (the last of 4 holds
    # none), each range's partial summed by the program that arrives last, which leaves its count at zero.
    for m, split in ((33, 1), (64, 2), (7, 4), (40, 4)):
        x, w, b = rand(m, 1100, gen=gen), rand(80, 1100, scale=0.05, gen=gen), rand(80, gen=gen)
        config = {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": split}
        ref, got = t.linear(x, w, b).float(), f.small_m(x, w, b, config).float()
        rest = f._arrivals(w, 80)
        fine = float((ref - got).norm() / ref.norm()) < 1e-3 and not rest.any()
        good &= check(f"linear m={m} split_k={split}", fine)
    # A square weight (o_proj) takes the engine's one-tile split-K path: 512 columns, 2 programs a tile.
    x, w, b = rand(6, 512, gen=gen), rand(512, 512, scale=0.05, gen=gen), rand(512, gen=gen)
    ref, got = t.linear(x, w, b).float(), f.linear(x, w, b).float()
    good &= check(
        "linear m=6 square", float((ref - got).norm() / ref.norm()) < 1e-3 and not f._arrivals(w, 512).any()
    )
    x, r, w = rand(5, 300), rand(5, 300), rand(300, scale=0.1) + 1
    for res in (None, r):
        (a, sa), (c, sc) = t.add_rms_norm(x, res, w, 1e-5), f.add_rms_norm(x, res, w, 1e-5)
        good &= check(f"add_rms_norm residual={res is not None}", torch.equal(sa, sc) and torch.equal(a, c))
    gu = rand(5, 2 * 1100)
    good &= check("silu_mul", torch.equal(t.silu_mul(gu), f.silu_mul(gu)))
    # One row: the SiLU-mul in the GEMV's epilogue gives the bits of the GEMV then silu_mul's launch.
    x, w = rand(1, 700), rand(2 * 301, 700, scale=0.05)
    fused, apart = f.gated_linear(x, w), f.silu_mul(f.linear(x, w))
    ref = t.gated_linear(x, w).float()
    close = float((fused.float() - ref).norm() / ref.norm()) < 2e-3
    good &= check("gated_linear m=1", fused.shape == (1, 301) and torch.equal(fused, apart) and close)
    logits = rand(3, 9000, scale=3.0)
    logits[1, 17] = logits[1, 4000] = logits[1].max() + 1  # a tie: the first index wins, as in torch
    (ta, la), (tb, lb) = t.greedy(logits), f.greedy(logits)
    good &= check("greedy", torch.equal(ta, tb) and int(tb[1]) == 17 and torch.allclose(la, lb, atol=1e-5))
    for qk in (False, True):
        heads, kvh, dim = 6, 2, 16
        qkv = rand(7, (heads + 2 * kvh) * dim)
        pos = torch.tensor([0, 5, 9, 100, 3, 2, 1])
        ang = torch.randn(128, dim, generator=g)
        norms = (rand(dim, scale=0.1) + 1, rand(dim, scale=0.1) + 1) if qk else (None, None)
        caches = [torch.zeros(4, 16, kvh, dim, dtype=DT) for _ in range(4)]
        slots = torch.tensor([3, 17, 20, 40, 41, 60, 1])
        args = (pos, ang.cos(), ang.sin(), *norms, 1e-6)
        qa = t.qkv_rope_cache(qkv, *args, caches[0], caches[1], slots, (heads, kvh, dim))
        qb = f.qkv_rope_cache(qkv, *args, caches[2], caches[3], slots, (heads, kvh, dim))
        same = torch.equal(qa, qb) and all(torch.equal(caches[i], caches[i + 2]) for i in (0, 1))
        good &= check(f"qkv_rope_cache qk_norm={qk}", same)
    # One row: the q|k|v GEMV with RoPE and the cache write in its epilogue gives the bits of the GEMV
    # then qkv_rope_cache's launch. Head dim 4 puts two heads in one program; bias as Qwen2 has it.
    gen = torch.Generator().manual_seed(5)
    for heads, kvh, dim, bias in ((6, 2, 16, False), (4, 1, 4, True)):
        n = (heads + 2 * kvh) * dim
        x, w = rand(1, 300, gen=gen), rand(n, 300, scale=0.05, gen=gen)
        b = rand(n, gen=gen) if bias else None
        ang = torch.randn(128, dim, generator=gen)
        slots = torch.tensor([21])
        args = (torch.tensor([37]), ang.cos(), ang.sin(), None, None, 1e-6)
        caches = [torch.zeros(4, 16, kvh, dim, dtype=DT) for _ in range(6)]
        shape = (heads, kvh, dim)
        fused = f.qkv_linear_rope_cache(x, w, b, *args, caches[0], caches[1], slots, shape)
        apart = f.qkv_rope_cache(f.linear(x, w, b), *args, caches[2], caches[3], slots, shape)
        ref = t.qkv_linear_rope_cache(x, w, b, *args, caches[4], caches[5], slots, shape)
        same = torch.equal(fused, apart) and all(torch.equal(caches[i], caches[i + 2]) for i in (0, 1))
        cached = caches[0].view(-1, kvh, dim)
        others = torch.ones(len(cached), dtype=torch.bool)
        others[slots] = False
        written = bool(cached[slots].any()) and not cached[others].any()
        close = all(
            float((a.float() - r.float()).norm() / r.float().norm()) < 2e-3
            for a, r in ((fused, ref), (caches[0], caches[4]), (caches[1], caches[5]))
        )
        good &= check(f"qkv_linear_rope_cache m=1 dim={dim}", same and written and close)
    return good


def guided_mask() -> bool:
    """The bitmask and the min_tokens lift: constrained and free rows, a partial last block, padding
    rows past n in the parameters, a row whose grammar allows only its stop tokens, one whose other
    allowed tokens its biases ban (-inf; a finite bias bans nothing), and greedy."""
    from fastpath.runtime.kernels.guided_mask import guided_mask_reference
    from fastpath.runtime.kernels.guided_mask_triton import guided_mask
    from fastpath.runtime.kernels.sampling import BIAS_BIT, STOP_BIT
    from fastpath.runtime.runner.penalties import PenaltyTable

    gen = torch.Generator().manual_seed(3)
    n, vocab, slots_col, min_col = 5, 9000, 9, 10
    words = -(-vocab // 32)
    logits = rand(n, vocab, scale=3.0, gen=gen)
    mask = torch.randint(-(2**31), 2**31 - 1, (n + 1, words), generator=gen, dtype=torch.int32)
    flags = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.int32)
    table = PenaltyTable(4, vocab, torch.device("cpu"))
    entries = table.entries
    stops = torch.tensor([7, 4097, 8999])
    entries[2, stops] = STOP_BIT
    entries[3, stops[:1]] = STOP_BIT | 3  # a stop token counted as generated three times
    mask[3] = 0
    mask[3, stops // 32] = (1 << (stops % 32)).to(torch.int32)  # row 3's grammar allows only its stops
    entries[2, :64] |= BIAS_BIT  # finite biases: allowed still
    table.biases[2, :64] = 5.0
    banned = torch.tensor([100, 5000, 6001])
    entries[1, stops] = STOP_BIT
    entries[1, banned] = BIAS_BIT
    table.biases[1, banned] = float("-inf")
    flags[1] = 1
    mask[1] = 0
    allowed1 = torch.cat([stops, banned])
    mask[1, allowed1 // 32] |= (1 << (allowed1 % 32)).to(torch.int32)  # row 1 (slot 1): stops and bans
    params = torch.randint(0, 50, (n + 1, 12), generator=gen)
    params[:, slots_col] = torch.tensor([2, 1, 0, 2, 3, 1])
    params[:, min_col] = 5
    good = True
    for with_params in (True, False):
        args = (params, entries, slots_col, min_col) if with_params else ()
        want_logits, want_params = guided_mask_reference(logits, mask, flags, *args)
        got_logits, got_params = guided_mask(logits.clone(), mask, flags, *args)
        same = torch.equal(want_logits, got_logits)
        if with_params:
            lifted = bool(
                (got_params[[1, 3], min_col] == 0).all() and (want_params[[1, 3], min_col] == 0).all()
            )
            kept = torch.equal(got_params[[0, 2, 4, 5], min_col], params[[0, 2, 4, 5], min_col])
            same &= torch.equal(want_params, got_params) and lifted and kept
        else:
            same &= got_params is None
        good &= check(f"guided_mask {'general' if with_params else 'greedy'}", same)
    # Inputs the kernels cannot index as they are (logits with a column stride, a mask a word short)
    # go to the reference: the same result, or its error, never a read past a buffer.
    strided = rand(n, 2 * vocab, scale=3.0, gen=gen)[:, ::2]
    want, got = guided_mask_reference(strided, mask, flags)[0], guided_mask(strided, mask, flags)[0]
    try:
        guided_mask(logits.clone(), mask[:, :-1], flags)
        short = False
    except (IndexError, RuntimeError):
        short = True
    good &= check("guided_mask falls back to its definition", torch.equal(want, got) and short)
    return good


def paged_decode(lens, width, window, block=16, kvh=2, heads=8, dim=16):
    """A decode step's q, paged K and V caches, its block tables and metadata: `width` pages a sequence."""
    nblocks = 1 + len(lens) * width
    k, v = rand(nblocks, block, kvh, dim), rand(nblocks, block, kvh, dim)
    tables = (torch.randperm(nblocks - 1, generator=g)[: len(lens) * width] + 1).view(len(lens), -1).int()
    q = rand(len(lens), heads, dim)
    return q, k, v, tables, decode_meta(tables, lens, block, window)


def decode_meta(tables, lens, block, window):
    return AttentionMetadata(
        "decode", torch.zeros(len(lens), dtype=torch.int64), tables, torch.tensor(lens, dtype=torch.int32),
        context_lens_host=lens, block_size=block, sliding_window=window, capturing=True,
    )  # fmt: skip


def attention_error(q, k, v, meta) -> float:
    ref = ReferenceAttention().forward(q.float(), k.float(), v.float(), meta, 0.25)
    got = TritonDecodeAttention().forward(q, k, v, meta, 0.25).float()
    return float((got - ref).norm() / ref.norm())


def decode_attention() -> bool:
    good = True
    for window in (None, 7):
        q, k, v, tables, meta = paged_decode([1, 17, 40, 9], 4, window)
        good &= check(f"triton_decode window={window}", attention_error(q, k, v, meta) < 2e-3)
        # One page a sequence: one split, its output written by the split kernel with no merge.
        one = decode_meta(tables[:, :1].contiguous(), [1, 16, 9, 3], 16, window)
        good &= check(f"triton_decode one split window={window}", attention_error(q, k, v, one) < 2e-3)
    # Contexts over several 64-token chunks, split evenly (one split left empty), then all in one split.
    for window in (None, 50):
        q, k, v, _, meta = paged_decode([1, 70, 130, 192], 12, window)
        for programs in (triton_decode.TARGET_PROGRAMS, 1):
            with mock.patch.object(triton_decode, "TARGET_PROGRAMS", programs):
                err = attention_error(q, k, v, meta)
            good &= check(f"triton_decode chunks, {programs} programs, window={window}", err < 2e-3)
    return good


def decode_attention_waits_for_the_new_row() -> bool:
    """Under PDL the split kernel may read a sequence's earlier keys and values before its wait, and
    must read the step's new one (position ctx - 1, which the q|k|v kernel before it writes) after.
    One program (one sequence, one KV head, one split), with the wait simulated: the new row holds
    garbage until the kernel waits, and its true values after. A kernel that read it early fails."""
    import triton.language as tl

    from fastpath.runtime.kernels import triton_ops

    good = True
    for ctx in (1, 21, 64, 70):
        q, k, v, tables, meta = paged_decode([ctx], 5, None, kvh=1, heads=4)
        ref = ReferenceAttention().forward(q.float(), k.float(), v.float(), meta, 0.25)
        page, slot = int(tables[0, (ctx - 1) // 16]), (ctx - 1) % 16
        true_k, true_v = k[page, slot].clone(), v[page, slot].clone()
        k[page, slot], v[page, slot] = 1e3, -1e3
        waits = []

        def wait(k=k, v=v, page=page, slot=slot, true_k=true_k, true_v=true_v, waits=waits):
            k[page, slot], v[page, slot] = true_k, true_v
            waits.append(1)

        cuda = tl.extra.cuda
        with (
            mock.patch.object(triton_decode, "TARGET_PROGRAMS", 1),
            mock.patch.object(triton_ops, "pdl_args", lambda x: {"USE_PDL": True}),
            mock.patch.object(cuda, "gdc_wait", wait),
            mock.patch.object(cuda, "gdc_launch_dependents", lambda: None),
        ):
            got = TritonDecodeAttention().forward(q, k, v, meta, 0.25).float()
        err = float((got - ref).norm() / ref.norm())
        good &= check(f"triton_decode reads the new row after its wait, ctx={ctx}", waits and err < 2e-3)
    return good


def prefill_attention() -> bool:
    """Every kind of query a prefill step holds: whole prompts, a chunk after a cached prefix, a
    lone token (a decode riding along), a prompt over two tiles; with and without a window."""
    good = True
    for window in (None, 7):
        qlens, ctxs, block, kvh, heads, dim, width = [5, 17, 1, 70], [5, 40, 9, 70], 16, 2, 8, 16, 5
        nblocks = 1 + len(qlens) * width
        k, v = rand(nblocks, block, kvh, dim), rand(nblocks, block, kvh, dim)
        tables = (
            (torch.randperm(nblocks - 1, generator=g)[: len(qlens) * width] + 1).view(len(qlens), -1).int()
        )
        q = rand(sum(qlens), heads, dim)
        meta = AttentionMetadata(
            "prefill", torch.zeros(sum(qlens), dtype=torch.int64), tables, torch.tensor(ctxs, dtype=torch.int32),
            query_lens=qlens, context_lens_host=ctxs, block_size=block, sliding_window=window,
        )  # fmt: skip
        ref = ReferenceAttention().forward(q.float(), k.float(), v.float(), meta, 0.25)
        got = TritonPrefillAttention().forward(q, k, v, meta, 0.25).float()
        good &= check(f"triton_prefill window={window}", float((got - ref).norm() / ref.norm()) < 2e-3)
        # A sequence's rows do not depend on the others in the step.
        alone = AttentionMetadata(
            "prefill", torch.zeros(17, dtype=torch.int64), tables[1:2], torch.tensor(ctxs[1:2], dtype=torch.int32),
            query_lens=[17], context_lens_host=[40], block_size=block, sliding_window=window,
        )  # fmt: skip
        solo = TritonPrefillAttention().forward(q[5:22].clone(), k, v, alone, 0.25).float()
        good &= check(f"triton_prefill batch-independent window={window}", torch.equal(solo, got[5:22]))
        good &= check(f"triton_prefill in a prefill graph's padded buffers window={window}",
                      torch.equal(padded_prefill(q, k, v, tables, qlens, ctxs, window), got))  # fmt: skip
    return good


def padded_prefill(q, k, v, tables, qlens, ctxs, window):
    """The live rows of triton_prefill run as a prefill graph runs it: queries padded to the bucket,
    the tile table with padding tiles, an extra empty sequence, stale table rows."""
    from fastpath.runtime.runner.prefill_graphs import PrefillLayout
    from fastpath.runtime.runner.step_inputs import PrefillStep

    n, s = sum(qlens), len(qlens)
    layout = PrefillLayout(tokens=128, seqs=s + 2, width=tables.shape[1] + 1)
    zeros = torch.zeros(n, dtype=torch.int64)
    step = PrefillStep(
        zeros,
        zeros,
        zeros,
        tables.long(),
        torch.tensor(ctxs),
        torch.tensor(qlens),
        torch.tensor([n - 1]),
        None,
    )
    host64 = torch.zeros(layout.words64, dtype=torch.int64)
    host32 = torch.full((layout.words32,), 7, dtype=torch.int32)  # stale entries
    layout.stage(step, host64, host32)
    static_tables, ends, tiles = layout.views32(host32)
    meta = AttentionMetadata(
        "prefill", layout.views64(host64)[2], static_tables, ends, block_size=k.shape[1], sliding_window=window,
        capturing=True,
    )  # fmt: skip
    meta._tables[("prefill_tiles", 64)] = tiles
    qpad = torch.cat([q, rand(layout.tokens - n, *q.shape[1:])])
    return TritonPrefillAttention().forward(qpad, k, v, meta, 0.25).float()[:n]


def fused_prologue() -> bool:
    """The one-launch unpack (native prologue on CUDA, and the FusedDecodePrologue hook) against the
    per-field reference, with and without the embedding lookup."""
    from types import SimpleNamespace

    from fastpath.runtime.runner import decode_inputs

    rows, width, hidden, vocab = 3, 5, 40, 50
    packed = torch.tensor(
        [[7, -1, 4, 68, 5, 4, 9, 0, 0, 0], [-1, 1, 2, 34, 3, 2, 0, 0, 0, 0], [0, -1, 0, 0, 1, 0, 0, 0, 0, 0]]
    )
    assert packed.shape == (rows, FIXED_COLUMNS + width)
    prev = torch.tensor([11, 23])
    embed = rand(vocab, hidden)
    good = True
    # The whole vocabulary (one rank), then a tensor-parallel rank's slice: rows of other ids stay zero.
    for start, size in ((0, vocab), (5, 10)):
        shard = embed[start : start + size]

        def lookup(ids, start=start, size=size, shard=shard):
            mine = (ids >= start) & (ids < start + size)
            rows_ = torch.nn.functional.embedding(torch.where(mine, ids - start, 0), shard)
            return rows_ * mine[:, None].to(rows_.dtype)

        native = DecodeBuffers.allocate(rows, width, hidden, DT, torch.device("cpu"))
        fused = DecodeBuffers.allocate(rows, width, hidden, DT, torch.device("cpu"))
        native_prologue(DecodeInputs(rows, packed, native, prev), lookup)  # per field on the CPU
        shard_module = SimpleNamespace(weight=shard, start=start, size=size)
        decode_inputs.unpack_in_one_launch(DecodeInputs(rows, packed, fused, prev), packed, shard_module)
        fields = ("input_ids", "positions", "slot_mapping", "context_lens", "block_tables", "embeds")
        same = all(torch.equal(getattr(native, f), getattr(fused, f)) for f in fields)
        some_zero = start > 0 and bool((fused.embeds == 0).all(dim=1).any())
        good &= check(f"fused prologue vocab=[{start}, {start + size})", same and (start == 0 or some_zero))
    # The native prologue's launch on CUDA: every field but the embeddings, first step and later ones.
    for prev_tokens in (None, prev):
        native = DecodeBuffers.allocate(rows, width, None, DT, torch.device("cpu"))
        fused = DecodeBuffers.allocate(rows, width, None, DT, torch.device("cpu"))
        decode_inputs._unpack_per_field(DecodeInputs(rows, packed, native, prev_tokens), packed)
        decode_inputs.unpack_in_one_launch(DecodeInputs(rows, packed, fused, prev_tokens), packed)
        fields = ("input_ids", "positions", "slot_mapping", "context_lens", "block_tables")
        same = all(torch.equal(getattr(native, f), getattr(fused, f)) for f in fields)
        good &= check(f"native unpack in one launch, previous tokens {prev_tokens is not None}", same)
    return good


def lora_deltas() -> bool:
    """The shrink and expand kernels against TorchOps' three ops, fp16 and fp32: rows with no adapter
    keep the projection's bits, another slot's inf never reaches a row, a launch repeated (the arrival
    counts back at zero) gives the same bits, and a row's bits do not depend on the rows beside it."""
    t, f = TorchOps(), TritonOps()
    good = True
    gen = torch.Generator().manual_seed(2)
    for dtype in (torch.float16, torch.float32):
        for m, k, n in ((1, 100, 40), (5, 1100, 70), (19, 300, 130)):
            slots_n, width = 3, 8
            cols = slots_n * width
            x = torch.randn(m, k, generator=gen).to(dtype)
            a = (torch.randn(k, cols, generator=gen) * 0.05).to(dtype)
            b = (torch.randn(cols, n, generator=gen) * 0.05).to(dtype)
            a[:, 2 * width] = float("inf")  # slot 2's first column: only its own rows may see it
            slots = torch.tensor([(i + 1) % 3 - 1 for i in range(m)], dtype=torch.int64)  # 0, 1, -1, 0, ...
            out = torch.randn(m, n, generator=gen).to(dtype)
            ref = t.lora_add(x, out.clone(), a, b, slots, width)
            got = f.lora_add(x, out.clone(), a, b, slots, width)
            again = f.lora_add(x, out.clone(), a, b, slots, width)
            none = slots < 0
            err = float((ref[~none].float() - got[~none].float()).norm() / ref[~none].float().norm())
            tol = 2e-3 if dtype == torch.float16 else 1e-5
            ok = torch.equal(got[none], out[none]) and err < tol and bool(got.isfinite().all())
            good &= check(
                f"lora deltas {dtype} m={m} k={k} n={n} (err {err:.1e})", ok and torch.equal(got, again)
            )
            if m > 1:  # row 1 (slot 1) alone: the same bits as in the batch
                alone = f.lora_add(x[1:2], out[1:2].clone(), a, b, slots[1:2], width)
                good &= check(
                    f"lora deltas {dtype} m={m}: a row alone keeps its bits", torch.equal(alone, got[1:2])
                )
    return good


if __name__ == "__main__":
    results = [
        lora_deltas(),
        ops(),
        guided_mask(),
        decode_attention(),
        decode_attention_waits_for_the_new_row(),
        prefill_attention(),
        fused_prologue(),
    ]
    sys.exit(0 if all(results) else 1)
