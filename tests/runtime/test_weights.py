"""Checkpoint loading: single file and shards; clear errors naming the tensor or field."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from fastpath.runtime import LLM, SamplingParams
from fastpath.runtime.model.config import ConfigError, ModelConfig
from fastpath.runtime.model.weights import WeightError

PROMPT = [[5, 9, 13, 2, 77]]
P = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_sharded_checkpoint_loads_the_same(hf_checkpoints, tmp_path):
    src = hf_checkpoints["qwen2"]
    dst = _copy(src, tmp_path / "sharded")
    tensors = load_file(dst / "model.safetensors")
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(dst / file))
        weight_map |= dict.fromkeys(part, file)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    a = LLM(str(src), device="cpu", max_seq_len=64).generate(PROMPT, P)[0].outputs[0].token_ids
    b = LLM(str(dst), device="cpu", max_seq_len=64).generate(PROMPT, P)[0].outputs[0].token_ids
    assert a == b


def test_missing_tensor_is_named(hf_checkpoints, tmp_path):
    dst = _copy(hf_checkpoints["llama"], tmp_path / "missing")
    tensors = load_file(dst / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(WeightError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        LLM(str(dst), device="cpu", max_seq_len=64)


def test_shape_mismatch_is_named(hf_checkpoints, tmp_path):
    dst = _copy(hf_checkpoints["llama"], tmp_path / "shape")
    tensors = load_file(dst / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:-1]
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(WeightError, match=r"shape mismatch for .*k_proj\.weight \(31, 64\)"):
        LLM(str(dst), device="cpu", max_seq_len=64)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"},
            "architectures: .*GPT2LMHeadModel.* not supported",
        ),
        ({"num_key_value_heads": 3}, "num_key_value_heads: 3 does not divide num_attention_heads 4"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type 'yarn' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act: 'gelu' is not supported"),
    ],
)
def test_config_errors_name_the_field(hf_checkpoints, tmp_path, edit, message):
    dst = _copy(hf_checkpoints["llama"], tmp_path / "cfg")
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(edit)
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dir(dst)


def test_missing_config_field_is_named(hf_checkpoints, tmp_path):
    dst = _copy(hf_checkpoints["llama"], tmp_path / "nofield")
    cfg = json.loads((dst / "config.json").read_text())
    del cfg["intermediate_size"]
    (dst / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="intermediate_size: missing from config.json"):
        ModelConfig.from_dir(dst)
