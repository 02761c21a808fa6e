"""The torch.compile peer of bench/decode.py is a real Llama: its greedy tokens equal HF transformers'."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from compile_peer import PeerConfig, PeerLlama, greedy, inv_frequencies

from fastpath.runtime.model.presets import resolve_random

UNTIED_PLAIN_ROPE = {
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}


@pytest.mark.parametrize("change", [{}, UNTIED_PLAIN_ROPE], ids=["tied-llama3-rope", "untied-plain-rope"])
def test_the_peer_decodes_the_tokens_hf_transformers_decodes(change):
    transformers = pytest.importorskip("transformers")
    preset = resolve_random("random:tiny-llama").to_hf_dict()
    hf_dict = {k: v for k, v in preset.items() if k != "architectures"} | change
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_dict)).eval()
    peer = PeerLlama(PeerConfig.from_hf(hf_dict))
    peer.load_hf(hf.state_dict())
    peer.setup_caches(batch=2, max_seq=64)
    prompts = torch.randint(3, hf_dict["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    want = hf.generate(prompts, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert greedy(peer, prompts, 12).tolist() == want[:, 9:].tolist()


def test_llama3_rope_scaling_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf_dict = {
        k: v for k, v in resolve_random("random:llama-1b").to_hf_dict().items() if k != "architectures"
    }
    cfg = transformers.LlamaConfig(**hf_dict)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    torch.testing.assert_close(inv_frequencies(PeerConfig.from_hf(hf_dict)), theirs.float())
