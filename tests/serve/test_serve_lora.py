"""LoRA adapters through the server (vLLM's --enable-lora --lora-modules): a request names an adapter
as its model and gets the offline engine's tokens under that adapter (itself checked against PEFT
in tests/runtime/test_lora.py); /v1/models lists the adapters; unknown names and bad adapters are
refused by name."""

import httpx
import openai
import pytest
from lora_files import write_adapter
from serve_helpers import client, engine, running

import fastpath.runtime.serve.cli as runtime_cli
from fastpath.runtime import BeamSearchParams, LoRARequest, SamplingParams
from fastpath.runtime.serve import ServeConfig, build_app
from fastpath.serve.cli import main

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def adapters(tiny_text_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "sql": write_adapter(tiny_text_checkpoint, root / "sql", 1, 8, ["q_proj", "v_proj", "down_proj"]),
        "chatty": write_adapter(tiny_text_checkpoint, root / "chatty", 2, 4, ["q_proj"]),
    }


@pytest.fixture(scope="module")
def lora_llm(tiny_text_checkpoint):
    with engine(tiny_text_checkpoint, enable_lora=True, max_loras=2, guided_backend="none") as llm:
        yield llm


@pytest.fixture(scope="module")
def url(lora_llm, adapters):
    with running(lora_llm, lora_modules=tuple(adapters.items())) as url:
        yield url


def request(adapters, name):
    return LoRARequest(name, 1 + list(adapters).index(name), adapters[name])  # the ids the server took


def test_models_lists_the_adapters_with_their_parent(url, adapters):
    cards = {m.id: m for m in client(url).models.list().data}
    assert list(cards) == ["tiny", "sql", "chatty"]
    assert (
        cards["sql"].model_extra["parent"] == "tiny" and cards["sql"].model_extra["root"] == adapters["sql"]
    )
    assert cards["tiny"].model_extra["parent"] is None
    assert client(url).models.retrieve("chatty").id == "chatty"


def test_a_completion_runs_the_adapter_its_model_names(url, lora_llm, adapters):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    got = {}
    for model in ("tiny", "sql", "chatty"):
        r = client(url).completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.model == model
        got[model] = r.choices[0].text
    for model in ("sql", "chatty"):
        (want,) = lora_llm.generate(PROMPT, params, lora_request=request(adapters, model))
        assert got[model] == want.outputs[0].text
    (base,) = lora_llm.generate(PROMPT, params)
    assert got["tiny"] == base.outputs[0].text
    assert len(set(got.values())) == 3, "each adapter changes the text"


def test_streamed_chat_and_beam_search_run_the_adapter(url, lora_llm, adapters):
    messages = [{"role": "user", "content": "Say something."}]
    chunks = client(url).chat.completions.create(
        model="sql", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (want,) = lora_llm.chat(
        messages, SamplingParams(temperature=0, max_tokens=10), lora_request=request(adapters, "sql")
    )
    assert text == want.outputs[0].text
    ids = lora_llm.get_tokenizer()(PROMPT)["input_ids"]
    r = client(url).completions.create(
        model="chatty", prompt=PROMPT, n=2, max_tokens=5, temperature=0,
        extra_body={"use_beam_search": True, "return_token_ids": True},
    )  # fmt: skip
    (beams,) = lora_llm.beam_search(
        [{"prompt_token_ids": ids}],
        BeamSearchParams(beam_width=2, max_tokens=5),
        lora_request=request(adapters, "chatty"),
    )
    assert [c.token_ids for c in r.choices] == [b.tokens[len(ids) :] for b in beams.sequences]


def test_an_unknown_model_is_404_naming_what_is_served(url):
    with pytest.raises(openai.NotFoundError, match="'nope' does not exist.*'tiny', 'sql', 'chatty'"):
        client(url).completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_adapters_are_checked_before_the_server_starts(llm, lora_llm, adapters, tmp_path):
    with pytest.raises(ValueError, match="--enable-lora"):
        build_app(llm, ServeConfig(lora_modules=(("sql", adapters["sql"]),)))
    with pytest.raises(ValueError, match="lora_request 'gone'.*no adapter_config.json"):
        build_app(lora_llm, ServeConfig(lora_modules=(("gone", str(tmp_path / "gone")),)))
    with pytest.raises(ValueError, match="'tiny' is also the served model's name"):
        build_app(lora_llm, ServeConfig(lora_modules=(("tiny", adapters["sql"]),)), model_name="tiny")
    with pytest.raises(ValueError, match="serve option lora_modules"):
        ServeConfig(lora_modules=(("a", "/x"), ("a", "/y")))


def test_the_command_line_takes_vllms_lora_flags(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(runtime_cli, "run", lambda factory, args, model_name=None: seen.append(args) or 0)
    argv = ["serve", "random:tiny-llama", "--enable-lora", "--max-loras", "3", "--max-lora-rank", "32",
            "--lora-modules", "sql=/a/sql", '{"name": "chat", "path": "/a/chat"}']  # fmt: skip
    assert main(argv) == 0
    (args,) = seen
    kwargs = runtime_cli.engine_kwargs(args)
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 3, 32)
    assert runtime_cli.serve_config(args).lora_modules == (("sql", "/a/sql"), ("chat", "/a/chat"))
    with pytest.raises(SystemExit):
        main(["serve", "random:tiny-llama", "--lora-modules", "sql"])
    assert "'sql' is not name=path" in capsys.readouterr().err


def test_adapters_load_and_unload_at_run_time_when_vllms_switch_allows(lora_llm, adapters, tmp_path):
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: a loaded name serves its adapter's
    tokens and is listed; an unloaded one is a 404 again; bad loads are 400s naming the field."""
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    with running(lora_llm, runtime_lora_updating=True) as url:
        post = lambda path, **body: httpx.post(f"{url}/v1/{path}", json=body)  # noqa: E731
        r = post("load_lora_adapter", lora_name="late", lora_path=adapters["chatty"])
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' added successfully."
        assert [m.id for m in client(url).models.list().data] == ["tiny", "late"]
        text = client(url).completions.create(model="late", prompt=PROMPT, max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True}).choices[0].text  # fmt: skip
        late = LoRARequest("late", lora_llm.lora_id_for(adapters["chatty"]), adapters["chatty"])
        (want,) = lora_llm.generate(PROMPT, params, lora_request=late)
        assert text == want.outputs[0].text
        again = post("load_lora_adapter", lora_name="late", lora_path=adapters["sql"])
        assert again.status_code == 400 and "has already been loaded" in again.json()["error"]["message"]
        for body, param, words in [
            ({"lora_name": "tiny", "lora_path": adapters["sql"]}, "lora_name", "served model's name"),
            ({"lora_name": "x"}, "lora_path", "required"),
            ({"lora_name": "", "lora_path": adapters["sql"]}, "lora_name", "at least 1 character"),
        ]:
            bad = post("load_lora_adapter", **body)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
            assert words in bad.json()["error"]["message"], bad.text
        missing = post("load_lora_adapter", lora_name="x", lora_path=str(tmp_path / "nothing"))
        assert missing.status_code == 404 and "No adapter found" in missing.json()["error"]["message"]
        r = post("unload_lora_adapter", lora_name="late")
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' removed successfully."
        with pytest.raises(openai.NotFoundError):
            client(url).completions.create(model="late", prompt=PROMPT, max_tokens=2)
        gone = post("unload_lora_adapter", lora_name="late")
        assert gone.status_code == 404 and "cannot be found" in gone.json()["error"]["message"]
    # Off by default, as in vLLM: the routes are not there.
    with running(lora_llm, runtime_lora_updating=False) as url:
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": adapters["sql"]})
        assert r.status_code == 404


def test_vllms_environment_switch_turns_run_time_adapters_on(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    assert ServeConfig().runtime_lora_updating
    with pytest.raises(ValueError, match="needs one API server process"):
        ServeConfig(api_server_count=2)
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0")
    assert not ServeConfig().runtime_lora_updating


def test_embeddings_and_scores_run_the_adapter_their_model_names(url, lora_llm, adapters):
    texts = ["The quick brown fox", "jumps over"]
    sql = request(adapters, "sql")
    want = [o.outputs.embedding for o in lora_llm.embed(texts, lora_request=sql, use_tqdm=False)]
    base = [o.outputs.embedding for o in lora_llm.embed(texts, use_tqdm=False)]
    r = client(url).embeddings.create(model="sql", input=texts)
    assert r.model == "sql"
    assert [d.embedding for d in r.data] == [pytest.approx(w, abs=1e-6) for w in want]
    assert want != base, "the adapter changes the vectors"
    body = httpx.post(f"{url}/score", json={"model": "sql", "text_1": texts[0], "text_2": texts[1]}).json()
    (scored,) = lora_llm.score(texts[0], texts[1], lora_request=sql, use_tqdm=False)
    assert body["model"] == "sql" and body["data"][0]["score"] == pytest.approx(
        scored.outputs.score, abs=1e-6
    )


def test_a_folder_loaded_again_after_its_files_changed_serves_the_new_weights(
    lora_llm, tiny_text_checkpoint, tmp_path
):
    folder = tmp_path / "swap"
    write_adapter(tiny_text_checkpoint, folder, 5, 8, ["q_proj", "v_proj"])
    with running(lora_llm, runtime_lora_updating=True) as url:
        post = lambda path, **body: httpx.post(f"{url}/v1/{path}", json=body)  # noqa: E731

        def ask() -> str:
            extra = {"ignore_eos": True}
            r = client(url).completions.create(
                model="swap", prompt=PROMPT, max_tokens=8, temperature=0, extra_body=extra
            )
            return r.choices[0].text

        assert post("load_lora_adapter", lora_name="swap", lora_path=str(folder)).status_code == 200
        first = ask()
        assert post("unload_lora_adapter", lora_name="swap").status_code == 200
        write_adapter(tiny_text_checkpoint, folder, 6, 8, ["q_proj", "v_proj"])  # new weights, same folder
        assert post("load_lora_adapter", lora_name="swap", lora_path=str(folder)).status_code == 200
        second = ask()
    fresh = LoRARequest("fresh", 999, str(folder))
    (want,) = lora_llm.generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), lora_request=fresh
    )
    assert second == want.outputs[0].text and second != first
