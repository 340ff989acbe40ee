"""Random weights drawn one at a time through transformers' loader (lorabench.builders.modeling.RandomWeight): the
model it builds is whole (no weight left on the meta device), initialised as transformers initialises it,
tied where the architecture ties, and on a GPU quantised by bitsandbytes as a checkpoint would be."""

import pytest
import torch
from conftest import compose_cfg, tiny_config
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from lorabench.builders import modeling
from lorabench.models import FAMILIES


def load_random(model_type):
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(tiny_config(model_type, initializer_range=0.1),
        dtype=torch.float32)
    weights = modeling.random_state_dict(skeleton, torch.device("cpu"))
    model = type(skeleton).from_pretrained(None, config=skeleton.config, state_dict=weights, dtype=torch.float32,
                                           device_map={"": "cpu"})
    return skeleton, weights, model


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_random_weights_build_the_whole_model(model_type):
    skeleton, weights, model = load_random(model_type)
    assert all(isinstance(w, modeling.RandomWeight) for w in weights.values())  # nothing drawn before the loader
    params = dict(model.named_parameters())
    assert not [n for n, p in params.items() if p.is_meta]
    assert set(params) == set(dict(skeleton.named_parameters()))
    # Norm weights as transformers initialises them (a norm that scales by 1 + w: w = 0, the identity), biases 0
    # (a linear layer's, a router's, a linear attention's step bias), the other vectors 1 (a linear attention's
    # decay, sinks, layer scalars): values that keep every layer computing, as random weights need
    own = dict(AutoModelForCausalLM.from_config(tiny_config(model_type, initializer_range=0.1),
                                                dtype=torch.float32).named_parameters())
    for name, p in params.items():
        if p.ndim == 1 and "norm" in name and name.endswith("weight"):
            assert torch.equal(p, own[name]), name
        elif p.ndim == 1:
            assert torch.all(p == (0.0 if name.endswith("bias") else 1.0)), name
    # The matrices: normal(0, initializer_range = 0.1). Over the embedding's 512 x 64 = 32,768 draws the sample
    # std's own standard error is 0.1 / sqrt(2 x 32,768) = 0.0004: 0.003 is more than seven of them.
    assert abs(model.get_input_embeddings().weight.std().item() - 0.1) < 0.003
    tied = model.config.tie_word_embeddings
    assert (model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()) == tied


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quantised_random_weights_never_hold_a_bf16_copy(tmp_path):
    """nf4 on the GPU: while the random weights load, the device's peak stays under the quantised model plus
    its largest bf16 weight and the loader's workspace (2x that weight), far under the bf16 model's size."""
    import bitsandbytes as bnb

    cfg = OmegaConf.to_object(compose_cfg(["model=mistral-7b-v0.3", "model.num_hidden_layers=4", "precision=nf4"]))
    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model, weights = modeling.build_model(cfg, device)
    peak = torch.cuda.max_memory_allocated() - base
    held = torch.cuda.memory_allocated() - base
    largest = max(p.numel() for p in model.parameters()) * 2  # bytes of the largest unquantised bf16 weight
    # A Linear4bit's weight holds two nf4 codes a byte (its numel is half the layer's): the layer's own shape
    bf16_model = 2 * sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, bnb.nn.Linear4bit))
    assert weights == "random_init" and isinstance(model.model.layers[0].self_attn.q_proj, bnb.nn.Linear4bit)
    assert peak <= held + 3 * max(largest, 1) and peak < bf16_model
