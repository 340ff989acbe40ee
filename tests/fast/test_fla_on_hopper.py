"""backend.fla_on_hopper: flash-linear-attention's gated backward let through on Hopper under Triton 3.4.0-3.7.0 for
the calls whose key tile is not the miscompiled 64-wide one, its refusal kept for those that take it. Here against a
stand-in of fla 0.6.0's chunk_o module (its refusal as written there); on a GPU, the rule's values against
transformers' PyTorch rule in float64: test_fla_computes_qwen3_5_s_model_on_gpu in test_fast_arch.py."""

import sys
import types

import pytest
import torch

from lorabench.fast import delta_rule, parts


@pytest.mark.parametrize("key_dim, tile", [(16, 16), (32, 32), (33, 64), (64, 64), (100, 128), (128, 128), (256, 128)])
def test_the_key_tile_is_the_next_power_of_two_from_16_to_128(key_dim, tile):
    assert delta_rule.key_tile(key_dim) == tile


@pytest.fixture
def fake_fla(monkeypatch):
    """fla.ops.common.chunk_o as 0.6.0 has it (the flag read at call time), and a rule's module that imported
    chunk_bwd_dqkwg by name."""
    chunk_o = types.ModuleType("fla.ops.common.chunk_o")
    chunk_o.IS_NVIDIA_HOPPER, chunk_o.calls = True, []

    def chunk_bwd_dqkwg(q, k, v, do, h, dh, w=None, g=None, **kwargs):
        if g is not None and chunk_o.IS_NVIDIA_HOPPER:
            raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results (see #640)")
        chunk_o.calls.append(k.shape[-1])
        return "dq", "dk", "dw", "dg"

    chunk_o.chunk_bwd_dqkwg = chunk_bwd_dqkwg
    rule = types.ModuleType("fla.ops.gated_delta_rule.chunk")
    rule.chunk_bwd_dqkwg = chunk_bwd_dqkwg
    for name in ("fla", "fla.ops", "fla.ops.common", "fla.ops.gated_delta_rule"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.ops.common.chunk_o", chunk_o)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule.chunk", rule)
    sys.modules["fla.ops.common"].chunk_o = chunk_o
    return chunk_o, rule


def test_the_refusal_is_lifted_for_other_tiles_only(fake_fla):
    chunk_o, rule = fake_fla
    assert delta_rule.lift_hopper_refusal() and delta_rule.lift_hopper_refusal()  # once, then found wrapped
    assert rule.chunk_bwd_dqkwg is chunk_o.chunk_bwd_dqkwg and getattr(rule.chunk_bwd_dqkwg, delta_rule.LIFTED)

    def args(key_dim):
        x = torch.zeros(1, 64, 2, key_dim)
        return (x, x, x, x, x, x), {"g": torch.zeros(1, 64, 2)}

    a, kw = args(128)
    assert rule.chunk_bwd_dqkwg(*a, **kw) == ("dq", "dk", "dw", "dg") and chunk_o.calls == [128]
    assert chunk_o.IS_NVIDIA_HOPPER is True  # set back after the call
    for key_dim in (64, 48):  # the 64-wide tile: fla's own refusal
        a, kw = args(key_dim)
        with pytest.raises(RuntimeError, match="#640"):
            rule.chunk_bwd_dqkwg(*a, **kw)
    assert chunk_o.calls == [128]


def test_a_model_whose_keys_take_the_miscompiled_tile_gets_the_part_turned_off_by_name():
    from conftest import tiny_config

    for key_dim, refused in ((16, False), (64, True), (128, False)):
        f = parts.features(tiny_config("qwen3_5_text", linear_key_head_dim=key_dim))
        assert f.linear_key_dim == key_dim
        why = parts._fla_lacks(f, None)
        assert (why is not None) == refused
        if refused:
            assert "64-wide key heads take that tile" in why.reason and why.off == {"fla_on_hopper": False}
    assert parts._fla_lacks(parts.features(tiny_config("llama")), None) is None



def test_fla_delta_net_patches_the_linear_attention_layers_where_fla_is_installed(monkeypatch):
    """backend.fla_delta_net on a CUDA cell: with fla installed each Gated DeltaNet layer runs lorabench.fast.
    delta_net's forward; without it the layers stay transformers' (as the rule does: transformers' PyTorch one)."""
    from conftest import tiny_config

    from lorabench.fast import delta_net, delta_rule

    qwen, cuda = parts.features(tiny_config("qwen3_5_text")), torch.device("cuda", 0)
    for installed in (False, True):
        patched = []
        monkeypatch.setattr(delta_rule, "fla_computes", lambda: installed)
        monkeypatch.setattr(delta_net, "patch", lambda model: patched.append(model) or 3)
        model = torch.nn.Linear(2, 2)  # stands for the built model
        assert parts._apply_delta_net(model, None, cuda, qwen) is model and patched == ([model] if installed else [])
        assert parts._apply_delta_net(model, None, torch.device("cpu"), qwen) is model and len(patched) <= 1
