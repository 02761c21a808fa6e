"""LoRA adapters (enable_lora): the tokens of PEFT's own generate over the same adapter files, for
batches that mix adapters and the base model, with more adapters than slots, the prefix cache, tensor
parallelism and the engine process; bad adapters fail their requests alone."""

import functools
import json

import pytest
import torch
from lora_adapters import ALL, build_adapter, peft_greedy
from safetensors.torch import load_file, save_file

from fastpath.runtime import LLM, LoRARequest, RequestError, SamplingParams
from fastpath.runtime.model.config import ModelConfig
from fastpath.runtime.model.lora_adapter import read_header, read_weights
from fastpath.runtime.model.lora_table import LoRATable
from fastpath.runtime.model.random_adapter import write_random_adapter
from fastpath.runtime.model.sharding import partition

PROMPTS = [[1, 5, 9, 33, 7], list(range(3, 60)), [4], [7, 7, 8, 200, 13, 100, 2, 90, 44]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
CPU32 = dict(device="cpu", dtype="float32", max_seq_len=256, max_batch_size=4, enable_lora=True)

# name -> (seed, rank, targets, extra LoraConfig fields)
KINDS = {
    "all": (1, 8, ALL, {}),
    "attn": (2, 4, ["q_proj", "v_proj"], {}),
    # rsLoRA's scale, a rank and an alpha of their own for two modules
    "mlp": (3, 8, ["o_proj", "gate_proj", "up_proj", "down_proj"],
            {"use_rslora": True, "rank_pattern": {"o_proj": 4}, "alpha_pattern": {"down_proj": 5}}),
    # an alpha_pattern key that is a regex, as PEFT matches it
    "regex": (4, 4, ["q_proj", "v_proj", "o_proj"], {"alpha_pattern": {"q_proj|v_proj": 1.0}}),
}  # fmt: skip


@pytest.fixture(scope="module")
def adapter(hf_checkpoints, tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")

    @functools.cache
    def get(arch: str, kind: str) -> LoRARequest:
        seed, r, targets, extra = KINDS[kind]
        path = build_adapter(hf_checkpoints[arch], root / f"{arch}-{kind}", seed, r, targets, **dict(extra))
        return LoRARequest(f"{arch}-{kind}", 1 + list(KINDS).index(kind), str(path))

    return get


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def want(base, prompts, loras, n=20) -> list[list[int]]:
    return [peft_greedy(base, r.lora_path if r else None, p, n) for p, r in zip(prompts, loras, strict=True)]


@pytest.mark.parametrize("arch", ["llama", "llama-tied-mqa", "qwen2", "qwen3"])
def test_a_batch_of_adapters_and_the_base_model_gives_pefts_tokens(hf_checkpoints, adapter, arch):
    """Four adapters and the base model in one call, two slots: some requests wait for a slot, and
    a slot is given up and loaded again."""
    base = hf_checkpoints[arch]
    a, b, c, d = (adapter(arch, k) for k in KINDS)
    prompts = PROMPTS + PROMPTS[:3]
    loras = [a, None, b, c, d, a, b]
    with LLM(str(base), max_loras=2, **CPU32) as llm:
        got = tokens(llm.generate(prompts, GREEDY, lora_request=loras))
        lora = llm.executor.scheduler.lora
        loads, refs = lora.num_loads, lora.refs
    assert got == want(base, prompts, loras)
    assert loads >= 4, "four adapters went through two slots"
    assert refs == [0, 0], "every finished sequence gave its slot back"
    assert got[0] != want(base, prompts[:1], [None])[0], "the adapter changes the tokens"


def test_the_prefix_cache_keeps_each_adapters_blocks_apart(hf_checkpoints, adapter):
    """The same 57-token prompt under the base model and two adapters: none may take another's KV,
    while a repeat under the same adapter finds its own."""
    base = hf_checkpoints["llama"]
    prompt = PROMPTS[1]
    order = [None, adapter("llama", "all"), adapter("llama", "attn"), adapter("llama", "all")]
    with LLM(str(base), enable_prefix_caching=True, max_loras=2, **CPU32) as llm:
        outs = [llm.generate([prompt], GREEDY, lora_request=r)[0] for r in order]
    assert tokens(outs) == want(base, [prompt] * 4, order)
    assert [o.lora_request for o in outs] == order, "each output names its adapter, as vLLM's"
    assert [o.num_cached_tokens for o in outs] == [0, 0, 0, 48]


def test_tensor_parallel_adapters_give_the_tokens_of_one_rank(hf_checkpoints, adapter):
    """Each rank applies its slice of B (q|k|v, gate|up) or of A (o, down); qwen2's biases, rsLoRA."""
    base = hf_checkpoints["qwen2"]
    loras = [adapter("qwen2", "all"), None, adapter("qwen2", "mlp"), adapter("qwen2", "attn")]
    with LLM(str(base), tensor_parallel_size=2, max_loras=2, **CPU32) as llm:
        got = tokens(llm.generate(PROMPTS, GREEDY, lora_request=loras))
    assert got == want(base, PROMPTS, loras)


def test_adapters_run_in_the_engine_process_and_stream(hf_checkpoints, adapter):
    base = hf_checkpoints["llama"]
    a = adapter("llama", "all")
    with LLM(str(base), engine_process=True, **CPU32) as llm:
        got = tokens(llm.generate(PROMPTS[:2], GREEDY, lora_request=a))
        streamed = [
            t for out in llm.stream(PROMPTS[0], GREEDY, lora_request=a) for t in out.outputs[0].token_ids
        ]
    assert got == want(base, PROMPTS[:2], [a, a])
    assert streamed == got[0]


def test_chat_and_beam_search_take_the_adapter(hf_checkpoints, adapter):
    from fastpath.runtime import BeamSearchParams

    base = hf_checkpoints["llama"]
    a = adapter("llama", "attn")
    with LLM(str(base), **CPU32) as llm:
        beams = llm.beam_search([{"prompt_token_ids": PROMPTS[0]}], BeamSearchParams(beam_width=1, max_tokens=8),
                                lora_request=a)  # fmt: skip
    best = beams[0].sequences[0]
    assert best.tokens[len(PROMPTS[0]) :] == peft_greedy(base, a.lora_path, PROMPTS[0], 8)
    assert best.lora_request == a


def test_bad_adapters_fail_their_requests_alone(hf_checkpoints, adapter, tmp_path):
    base = hf_checkpoints["llama"]
    a = adapter("llama", "all")
    wide = build_adapter(base, tmp_path / "wide", 4, 16, ["q_proj"])
    head = build_adapter(base, tmp_path / "head", 5, 4, ["q_proj", "lm_head"])
    alora = build_adapter(base, tmp_path / "alora", 6, 4, ["q_proj"])
    config = json.loads((alora / "adapter_config.json").read_text())
    (alora / "adapter_config.json").write_text(json.dumps({**config, "alora_invocation_tokens": [5, 9]}))
    deep = build_adapter(base, tmp_path / "deep", 7, 4, ["q_proj"])
    (deep / "adapter_config.json").write_text("[" * 100_000 + "]" * 100_000)
    rank0 = tmp_path / "rank0"
    rank0.mkdir()
    (rank0 / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 0}))
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    zeros = {f"{key}.lora_A.weight": torch.zeros(0, 64), f"{key}.lora_B.weight": torch.zeros(64, 0)}
    save_file(zeros, rank0 / "adapter_model.safetensors")
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "adapter_config.json").write_text("{")
    (bad_json / "adapter_model.safetensors").write_bytes(
        (tmp_path / "wide" / "adapter_model.safetensors").read_bytes()
    )
    cases = {
        "no adapter_config.json": LoRARequest("missing", 11, str(tmp_path / "nowhere")),
        "above max_lora_rank 8": LoRARequest("wide", 12, str(wide)),
        "lm_head": LoRARequest("head", 13, str(head)),
        "is not JSON": LoRARequest("bad_json", 14, str(bad_json)),
        "already names": LoRARequest("same id", a.lora_int_id, str(wide)),
        "activated LoRA (aLoRA) adapters": LoRARequest("alora", 15, str(alora)),
        "adapter_config.json is not JSON": LoRARequest("deep", 16, str(deep)),
        "has rank 0": LoRARequest("rank0", 17, str(rank0)),
    }
    with LLM(str(base), max_lora_rank=8, **CPU32) as llm:
        assert tokens(llm.generate(PROMPTS[:1], GREEDY, lora_request=a)) == want(base, PROMPTS[:1], [a])
        loras = [a, *cases.values()]
        outs = llm.generate([PROMPTS[0]] * len(loras), GREEDY, lora_request=loras, errors="return")
        assert outs[0].outputs[0].token_ids == want(base, PROMPTS[:1], [a])[0]
        for (words, r), out in zip(cases.items(), outs[1:], strict=True):
            assert words in out.error and r.lora_name in out.error, out.error
        with pytest.raises(RequestError, match="lora_request must be a LoRARequest"):
            llm.generate(PROMPTS[:1], GREEDY, lora_request=[{"lora_path": a.lora_path}])
        with pytest.raises(ValueError, match="lora_request has 2 entries for 1 prompts"):
            llm.generate(PROMPTS[:1], GREEDY, lora_request=[a, a])


def test_lora_switches_are_checked(hf_checkpoints, adapter):
    base = str(hf_checkpoints["llama"])
    off = dict(CPU32, enable_lora=False)
    with LLM(base, **off) as llm, pytest.raises(RequestError, match=r"enable_lora=True"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=adapter("llama", "all"))
    for kw, words in [
        (dict(enable_lora="yes"), "enable_lora must be True or False"),
        (dict(max_loras=0), "max_loras must be an int >= 1"),
        (dict(max_lora_rank=1024), "max_lora_rank must be an int >= 1, at most 512"),
    ]:
        with pytest.raises(ValueError, match=words):
            LLM(base, **dict(CPU32, **kw))
    for bad in [dict(lora_int_id=0), dict(lora_name=""), dict(lora_path="")]:
        with pytest.raises(ValueError, match="LoRARequest"):
            LoRARequest(**{**dict(lora_name="x", lora_int_id=1, lora_path="/x"), **bad})


def test_a_rows_delta_depends_on_its_own_slot_only(hf_checkpoints, adapter):
    """The masked matmuls: a row with no adapter keeps the base output's bits, and a row's result has
    the same bits whichever adapters the other rows run."""
    from fastpath.runtime.kernels.torch_ops import TorchOps

    ops = TorchOps()
    cfg = ModelConfig.from_dir(hf_checkpoints["llama"])
    table = LoRATable(cfg, partition(cfg, 0, 1), 2, 8, 16, torch.float32, torch.device("cpu"))
    for slot, kind in enumerate(["all", "attn"]):
        table.load(slot, read_weights(read_header(adapter("llama", kind).lora_path, cfg, 8), torch.float32))
    x, base = torch.randn(6, cfg.hidden_size), torch.randn(6, cfg.q_size + 2 * cfg.kv_size)
    slots = [0, -1, 1, 0, -1, 1]
    table.place(torch.tensor(slots), 6)
    mixed = table.begin(6, ops).add(0, "qkv", x, base.clone())  # the add may write its `out` in place
    assert torch.equal(mixed[[1, 4]], base[[1, 4]])
    assert not torch.equal(mixed[[0, 2]], base[[0, 2]])
    for slot in (0, 1):
        table.place(torch.full((6,), slot), 6)
        alone = table.begin(6, ops).add(0, "qkv", x, base.clone())
        rows = [i for i, s in enumerate(slots) if s == slot]
        assert torch.equal(mixed[rows], alone[rows])
    # Slot 1's adapter targets attention only: its rows' down_proj keeps the base bits.
    out = torch.randn(6, cfg.hidden_size)
    assert torch.equal(
        table.begin(6, ops).add(1, "down", torch.randn(6, cfg.intermediate_size), out.clone()), out
    )


def test_slots_go_to_the_least_recently_released_adapter_and_know_an_adapter_by_id_and_folder():
    from fastpath.runtime.engine.adapter_store import AdapterStore
    from fastpath.runtime.engine.lora_slots import LoRASlots
    from fastpath.runtime.engine.sequence import Sequence

    def seq(lora):
        s = Sequence(0, [1], GREEDY, 0, frozenset(), 64)
        s.lora = lora
        return s

    a, b, c = (LoRARequest(n, i, f"/{n}") for i, n in enumerate("abc", start=1))
    other_a = LoRARequest("a elsewhere", 1, "/not-a")  # another client's id 1
    slots = LoRASlots(2, AdapterStore(lambda r: {}, 2))
    sa, sb = seq(a), seq(b)
    slots.acquire(sa)
    slots.acquire(sb)
    assert (sa.lora_slot, sb.lora_slot) == (0, 1) and slots.take_loads() == [(0, a), (1, b)]
    assert not slots.can_take(seq(c)) and not slots.can_take(seq(other_a))
    slots.release(sb)
    slots.release(sa)  # a was released last: b's slot goes first
    sc = seq(c)
    slots.acquire(sc)
    assert sc.lora_slot == 1 and slots.take_loads() == [(1, c)]
    again = seq(a)
    slots.acquire(again)
    assert again.lora_slot == 0 and slots.take_loads() == [], "a is still in its slot"
    assert len({slots.namespace(r) for r in (a, b, c, other_a)}) == 4 and slots.namespace(None) == 0


def test_peft_defaults_lora_alpha_to_eight(hf_checkpoints, tmp_path):
    """A config without lora_alpha scales by PEFT's default alpha, 8, not by r."""
    base = hf_checkpoints["llama"]
    path = build_adapter(base, tmp_path / "no-alpha", 6, 4, ["q_proj", "down_proj"])
    config = json.loads((path / "adapter_config.json").read_text())
    del config["lora_alpha"]
    (path / "adapter_config.json").write_text(json.dumps(config))
    r = LoRARequest("no-alpha", 1, str(path))
    with LLM(str(base), **CPU32) as llm:
        assert tokens(llm.generate(PROMPTS[:2], GREEDY, lora_request=r)) == want(base, PROMPTS[:2], [r, r])


def test_an_adapter_that_cannot_be_read_in_the_engine_fails_its_requests_alone(hf_checkpoints, tmp_path):
    """Admission reads a folder's header; the engine reads the weights when a request enters it. A NaN
    (which the masked matmuls would spread to every row) or a folder gone since the adapter left
    host memory fails that request with a message naming the adapter; the engine goes on."""
    base = hf_checkpoints["llama"]
    cfg = ModelConfig.from_dir(base)
    good = LoRARequest("good", 1, write_random_adapter(cfg, tmp_path / "good", 1, 4, ["q_proj"]))
    gone = LoRARequest("gone", 2, write_random_adapter(cfg, tmp_path / "gone", 2, 4, ["q_proj"]))
    nan = LoRARequest("nan", 3, write_random_adapter(cfg, tmp_path / "nan", 3, 4, ["v_proj"]))
    weights = load_file(tmp_path / "nan" / "adapter_model.safetensors")
    next(t for name, t in sorted(weights.items()) if "lora_B" in name)[0, 0] = float("nan")
    save_file(weights, tmp_path / "nan" / "adapter_model.safetensors")
    for engine_process in (False, True):
        with LLM(str(base), max_loras=1, engine_process=engine_process, **CPU32) as llm:
            want_base = tokens(llm.generate(PROMPTS[:1], GREEDY))
            llm.generate(PROMPTS[:1], GREEDY, lora_request=gone)
            llm.generate(PROMPTS[:1], GREEDY, lora_request=good)  # gone leaves the slot and host memory
            (tmp_path / "gone" / "adapter_model.safetensors").rename(tmp_path / "gone.bak")
            outs = llm.generate(PROMPTS[:3], GREEDY, lora_request=[gone, None, nan], errors="return")
            (tmp_path / "gone.bak").rename(tmp_path / "gone" / "adapter_model.safetensors")
            assert "lora_request 'gone'" in outs[0].error and "adapter_model.safetensors" in outs[0].error
            assert "lora_request 'nan'" in outs[2].error and "NaN or inf" in outs[2].error
            assert (
                outs[1].error is None and outs[1].outputs[0].token_ids == want(base, PROMPTS[1:2], [None])[0]
            )
            with pytest.raises(RequestError, match="lora_request 'nan'"):
                llm.generate(PROMPTS[:1], GREEDY, lora_request=nan)
            with pytest.raises(RequestError, match="lora_request 'nan'"):
                list(llm.stream(PROMPTS[:1], GREEDY, lora_request=nan))
            assert tokens(llm.generate(PROMPTS[:1], GREEDY)) == want_base
            assert tokens(llm.generate(PROMPTS[:1], GREEDY, lora_request=gone)) == want(
                base, PROMPTS[:1], [gone]
            )


def test_a_request_waiting_for_a_slot_lets_the_ones_behind_it_run(hf_checkpoints, adapter):
    """One slot, held by a long request: a second adapter's request waits, and the base model's
    request behind it runs meanwhile (vLLM's scheduler skips it too)."""
    base = hf_checkpoints["llama"]
    a, b = adapter("llama", "all"), adapter("llama", "attn")
    long, short = (SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (60, 4))
    finished = []
    with LLM(str(base), max_loras=1, **CPU32) as llm:
        for out in llm.stream(PROMPTS[:3], [long, short, short], lora_request=[a, b, None]):
            if out.finished:
                finished.append(out.request_id)
    ids = sorted(finished, key=int)  # request ids in submission order: a, b, the base model's
    assert finished.index(ids[2]) < finished.index(ids[0]), f"the base request waited: {finished}"


def test_max_cpu_loras_is_at_least_max_loras(hf_checkpoints):
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be at least max_loras \(2\)"):
        LLM(str(hf_checkpoints["llama"]), max_loras=2, max_cpu_loras=1, **CPU32)


def test_an_adapters_overflow_stays_in_its_own_rows(hf_checkpoints, tmp_path):
    """Finite weights whose shrink overflows (here A of ±1e38 in float32; in float16 a few thousand
    do): the other rows, with no adapter or another, keep their tokens."""
    base = hf_checkpoints["llama"]
    cfg = ModelConfig.from_dir(base)
    path = write_random_adapter(cfg, tmp_path / "huge", 8, 4, ["q_proj"])
    weights = load_file(tmp_path / "huge" / "adapter_model.safetensors")
    save_file(
        {k: t.sign() * 1e38 if "lora_A" in k else t for k, t in weights.items()},
        tmp_path / "huge" / "adapter_model.safetensors",
    )
    other = LoRARequest("attn", 2, write_random_adapter(cfg, tmp_path / "attn", 9, 4, ["v_proj"]))
    with LLM(str(base), max_loras=2, **CPU32) as llm:
        alone = tokens(llm.generate(PROMPTS[:2], GREEDY, lora_request=[None, other]))
        beside = tokens(
            llm.generate(PROMPTS[:3], GREEDY, lora_request=[None, other, LoRARequest("huge", 1, path)])
        )
    assert beside[:2] == alone


def test_an_adapters_id_follows_its_folder_however_it_is_spelled(hf_checkpoints, adapter, monkeypatch):
    from fastpath.runtime.engine.lora_admission import LoRAAdmission

    folder = adapter("llama", "attn").lora_path
    monkeypatch.chdir(folder)
    admission = LoRAAdmission(ModelConfig.from_dir(hf_checkpoints["llama"]), 2, 16)
    first = admission.id_for(".")
    admission.check(LoRARequest("here", first, "."))
    assert admission.id_for(folder) == admission.id_for("./") == first


def test_a_step_with_no_adapter_row_runs_the_base_model_path(hf_checkpoints, adapter, monkeypatch):
    """Only steps where some row has an adapter run the deltas (on CUDA, their own graphs): a request
    of the base model beside none gets the LoRA-off engine's tokens and logprobs, bit for bit."""
    base = str(hf_checkpoints["llama"])
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=2)
    with LLM(base, **dict(CPU32, enable_lora=False)) as llm:
        off = llm.generate(PROMPTS, params, use_tqdm=False)
    passes = []
    begin = LoRATable.begin
    monkeypatch.setattr(LoRATable, "begin", lambda self, n, ops: passes.append(n) or begin(self, n, ops))
    with LLM(base, **CPU32) as llm:
        on = llm.generate(PROMPTS, params, use_tqdm=False)
        assert passes == [], "no step had an adapter row"
        llm.generate(PROMPTS[:1], params, lora_request=adapter("llama", "attn"), use_tqdm=False)
        assert passes, "a step with an adapter row runs the deltas"
    for a, b in zip(on, off, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].cumulative_logprob == b.outputs[0].cumulative_logprob


@torch.no_grad()
def peft_embedding(base, adapter, prompt: list[int]) -> torch.Tensor:
    """The last token's final hidden state, L2-normalized (embed()'s default), of PEFT's model with the
    adapter (the LoRA layers sit inside the base model's module tree)."""
    from lora_adapters import peft_model

    model = peft_model(str(base), adapter)
    inner = model.base_model.model.model if adapter else model.model
    return torch.nn.functional.normalize(inner(torch.tensor([prompt])).last_hidden_state[0, -1], dim=-1)


@pytest.mark.parametrize(("engine_process", "tp"), [(False, 1), (True, 1), (False, 2)])
def test_embeddings_take_the_adapter_each_prompt_names(hf_checkpoints, adapter, engine_process, tp):
    """Four adapters and the base model through two slots: a pooling step takes the prompts whose
    adapters hold or find a slot, the next step the rest; each vector is PEFT's model's."""
    base = hf_checkpoints["llama"]
    loras = [adapter("llama", k) for k in KINDS] + [None]
    prompts = [PROMPTS[i % 4] for i in range(5)]
    with LLM(str(base), max_loras=2, engine_process=engine_process, tensor_parallel_size=tp, **CPU32) as llm:
        outs = llm.embed(prompts, lora_request=loras, use_tqdm=False)
        scored = llm.score(PROMPTS[0], PROMPTS[1:3], lora_request=loras[0], use_tqdm=False)
        after = tokens(llm.generate(PROMPTS[:2], GREEDY, lora_request=[loras[1], None]))
        if llm.executor is not None:
            assert llm.executor.scheduler.lora.refs == [0, 0], "pooling gave its slots back"
            assert llm.executor.allocator.num_free == llm.executor.allocator.num_blocks - 1
    for prompt, r, out in zip(prompts, loras, outs, strict=True):
        want_vector = peft_embedding(base, r.lora_path if r else None, prompt)
        torch.testing.assert_close(torch.tensor(out.outputs.embedding), want_vector, atol=2e-6, rtol=1e-5)
    a = [peft_embedding(base, loras[0].lora_path, p) for p in PROMPTS[:3]]
    assert [s.outputs.score for s in scored] == pytest.approx(
        [float(a[0] @ a[1]), float(a[0] @ a[2])], abs=1e-5
    )
    assert after == want(base, PROMPTS[:2], [loras[1], None]), "generation after pooling keeps its adapters"


@torch.no_grad()
@pytest.mark.parametrize("engine_process", [False, True])
def test_prompt_logprobs_are_the_adapters(hf_checkpoints, adapter, engine_process):
    """prompt_logprobs under an adapter: PEFT's model's log-softmax at each prompt position, for two
    adapters and the base model beside each other, through two slots."""
    from lora_adapters import peft_model

    base = hf_checkpoints["llama"]
    loras = [adapter("llama", "all"), None, adapter("llama", "mlp"), adapter("llama", "attn")]
    prompt = PROMPTS[1]
    params = SamplingParams(max_tokens=2, prompt_logprobs=2, temperature=0)
    with LLM(str(base), max_loras=2, engine_process=engine_process, **CPU32) as llm:
        outs = llm.generate([prompt] * 4, params, lora_request=loras, use_tqdm=False)
    for r, out in zip(loras, outs, strict=True):
        logits = peft_model(str(base), r.lora_path if r else None)(torch.tensor([prompt])).logits[0]
        lp = torch.log_softmax(logits.float(), dim=-1)
        assert out.prompt_logprobs[0] is None
        for j, entry in enumerate(out.prompt_logprobs[1:]):
            token = prompt[j + 1]
            assert entry[token].logprob == pytest.approx(float(lp[j, token]), abs=1e-4)
            assert {t for t, e in entry.items() if e.rank <= 2} == set(lp[j].topk(2).indices.tolist())
    assert outs[0].prompt_logprobs != outs[1].prompt_logprobs, "the adapter changes them"
