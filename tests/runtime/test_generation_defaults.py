"""A checkpoint's generation_config.json gives the sampling defaults of requests that leave them
unset, as vLLM's generation_config="auto" does; "vllm" keeps SamplingParams' own."""

import json
import shutil

import pytest

from fastpath.runtime import LLM, SamplingParams


@pytest.fixture
def checkpoint(tiny_text_checkpoint, tmp_path):
    folder = tmp_path / "with-defaults"
    shutil.copytree(tiny_text_checkpoint, folder)
    config = {"temperature": 0.0, "top_k": 20, "max_new_tokens": 5, "do_sample": True, "eos_token_id": 2}
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


def test_unset_fields_take_the_models_defaults(checkpoint):
    with LLM(str(checkpoint), device="cpu", max_model_len=128) as llm:
        defaults = llm.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_k, defaults.max_tokens) == (0.0, 20, 5)
        got = llm.generate([5, 6, 7], use_tqdm=False)[0].outputs[0].token_ids
        want = llm.generate([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=5), use_tqdm=False)
        assert got == want[0].outputs[0].token_ids and len(got) <= 5


def test_vllm_keeps_sampling_params_own_defaults(checkpoint):
    with LLM(str(checkpoint), device="cpu", max_model_len=128, generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()


def test_a_folder_gives_its_file_and_a_bad_value_names_the_file(checkpoint, tiny_text_checkpoint, tmp_path):
    with LLM(
        str(tiny_text_checkpoint), device="cpu", max_model_len=128, generation_config=str(checkpoint)
    ) as llm:
        assert llm.get_default_sampling_params().max_tokens == 5
    (checkpoint / "generation_config.json").write_text(json.dumps({"top_p": 7}))
    with pytest.raises(
        ValueError, match=r"generation_config: .*generation_config.json: SamplingParams.top_p"
    ):
        LLM(str(checkpoint), device="cpu", max_model_len=128)
    with pytest.raises(ValueError, match="does not exist"):
        LLM(str(tiny_text_checkpoint), device="cpu", generation_config=str(tmp_path / "nowhere"))
