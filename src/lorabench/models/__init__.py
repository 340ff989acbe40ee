"""The model axis: a model group's transformers config, and its Architecture.

`hf_config(model_cfg)` is the transformers config of a cell's model: the checkpoint's config.json
with model.path, else conf/model/<name>.yaml's values through AutoConfig.for_model (any
model_type transformers knows). `architecture_of(model_cfg)` is that config's Architecture, the facts
every consumer reads (lorabench.models.architecture).
"""

from __future__ import annotations

from pathlib import Path

from lorabench.core.config import ModelConfig
from lorabench.models.architecture import Architecture
from lorabench.models.families import FAMILIES, Family, family

__all__ = ["Architecture", "FAMILIES", "Family", "architecture_of", "family", "hf_config"]

# ModelConfig fields that are transformers config keys of the same name.
SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "initializer_range", "rope_theta")


def hf_config(m: ModelConfig):
    """The model's transformers PretrainedConfig: model.path's config.json, or the model group's values
    (model.hf_config holds the published config.json's other keys: rope scaling, biases, windows...)."""
    from transformers import AutoConfig

    if m.path:
        local = Path(m.path).expanduser()
        return AutoConfig.from_pretrained(str(local) if local.exists() else m.path,
                                          trust_remote_code=m.trust_remote_code)
    fields = {k: getattr(m, k) for k in SHAPE_KEYS}
    if m.head_dim is not None:  # Qwen2 has no head_dim key: hidden / heads
        fields["head_dim"] = m.head_dim
    fields.update(m.hf_config)
    fields["use_cache"] = False  # training: no KV cache
    return AutoConfig.for_model(m.model_type, **fields)


def architecture_of(m: ModelConfig) -> Architecture:
    cfg = hf_config(m)  # model.path's config.json, else the option's values
    return Architecture.from_hf_config(cfg)
