"""The attention's LoRA projections in one Function (lorabench.fused, backend.fused_lora).

It must compute PEFT's arithmetic: the same loss and LoRA gradients on one batch (tiny Mistral), with
LoRA dropout too. PEFT's dropout and the Function's draw their masks in different kernels, so both are
given one mask source here: uniform draws from torch's global generator, in the same order (q, k, v, o
of each layer), which activation checkpointing replays when it recomputes a layer.
"""

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import compose_cfg, requires_cuda
from lorabench import checks, fused
from test_backends import assert_grads_close, lora_grads


NATIVE_DROPOUT = fused._dropout


def _mask(x, p):
    return torch.rand(x.shape, device=x.device) >= p


class _SameMaskDropout(nn.Dropout):
    def forward(self, x):
        return x * _mask(x, self.p) / (1 - self.p) if self.training else x


@pytest.fixture
def same_masks(monkeypatch):
    """PEFT's dropout modules and the Function's dropout draw one mask source."""
    import peft.tuners.lora.layer as lora_layer

    def dropout(x, p):
        m = _mask(x, p)
        return x * m / (1 - p), m

    monkeypatch.setattr(fused, "_dropout", dropout)
    monkeypatch.setattr(lora_layer.nn, "Dropout", _SameMaskDropout)  # PEFT builds nn.Dropout(p) per adapter


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fused_lora_matches_peft_on_cpu(same_masks, monkeypatch, dropout):
    """fp32 on CPU, half the layers checkpointed (the recompute replays the masks): loss to 1e-6 and
    every LoRA gradient to 1e-5 of its norm (fp32 round-off); with dropout 0.1 the masks take part."""
    cpu = torch.device("cpu")
    opt = [f"lora.dropout={dropout}", "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    loss_peft, g_peft, _ = lora_grads(opt, cpu)
    loss_fused, g_fused, _ = lora_grads([*opt, "backend.fused_lora=true"], cpu)
    assert loss_fused == pytest.approx(loss_peft, rel=1e-6)
    assert_grads_close(g_fused, g_peft, 1e-5)
    if dropout:  # with its own masks (torch's dropout kernel) it differs far beyond round-off
        monkeypatch.setattr(fused, "_dropout", NATIVE_DROPOUT)
        _, g_other, _ = lora_grads([*opt, "backend.fused_lora=true"], cpu)
        assert max((g_other[n] - g_peft[n]).norm() / g_peft[n].norm() for n in g_peft) > 1e-2


def test_fused_lora_is_refused_with_int8_by_name():
    c = OmegaConf.to_object(compose_cfg(["backend.fused_lora=true", "precision=int8"]))
    with pytest.raises(ValueError, match="backend.fused_lora=true .* not precision=int8"):
        checks.check_values(c)
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "backend.fused_lora=true"]))
    with pytest.raises(ValueError, match="fused_lora=True"):
        checks.check_values(c)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fused_lora_matches_peft_on_gpu_nf4(same_masks, dropout):
    """nf4 base layers, bf16 compute, under autocast as the Trainer runs it: within 3% of each
    gradient's norm (a few bf16 rounding steps of 0.4%; a wrong formula is off by far more)."""
    cuda = torch.device("cuda", 0)
    opt = ["precision=nf4", "optimizer=adamw_torch", f"lora.dropout={dropout}",
           "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    loss_peft, g_peft, _ = lora_grads(opt, cuda)
    loss_fused, g_fused, _ = lora_grads([*opt, "backend.fused_lora=true"], cuda)
    assert loss_fused == pytest.approx(loss_peft, rel=1e-2)
    assert_grads_close(g_fused, g_peft, 3e-2)
