"""The attention's LoRA projections in one Function (lorabench.fast.fused, backend.fused_lora).

It must compute PEFT's arithmetic: the same loss and LoRA gradients on one batch (tiny Mistral), with
LoRA dropout too. PEFT's dropout and the Function's draw their masks in different kernels, so both are
given one mask source here: uniform draws from torch's global generator, in the same order (q, k, v, o
of each layer), which activation checkpointing replays when it recomputes a layer.
"""

import pytest
import torch
from conftest import BF16_GRADS, BF16_LOSS, SAME_MATH, assert_grads_close, compose_cfg, lora_grads, requires_cuda, spy
from omegaconf import OmegaConf
from torch import nn

from lorabench.fast import flat_optim, fused
from lorabench.run import checks

NATIVE_DROPOUT = fused._dropout


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_fused_lora_matches_peft_on_cpu(same_masks, monkeypatch, float64, dropout):
    """float64 on CPU, half the layers checkpointed (the recompute replays the masks): the loss and
    every LoRA gradient (relative to its norm) within SAME_MATH; with dropout 0.1 the masks take part.
    Without dropout q, k and v's adapters share their thin GEMMs (one call per layer's q/k/v group)."""
    cpu = torch.device("cpu")
    opt = [f"lora.dropout={dropout}", "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    loss_peft, g_peft, _ = lora_grads(opt, cpu)
    merged = spy(monkeypatch, fused, "_merged_adapter_grads")
    loss_fused, g_fused, _ = lora_grads([*opt, "backend.fused_lora=true"], cpu)
    assert loss_fused == pytest.approx(loss_peft, rel=SAME_MATH)
    assert_grads_close(g_fused, g_peft, SAME_MATH)
    assert len(merged) == (0 if dropout else 2)  # the tiny model's 2 layers
    if dropout:  # with its own masks (torch's dropout kernel) it differs far beyond round-off:
        # other masks change a tenth of each adapter's inputs, of the order of 10% of a gradient
        monkeypatch.setattr(fused, "_dropout", NATIVE_DROPOUT)
        _, g_other, _ = lora_grads([*opt, "backend.fused_lora=true"], cpu)
        assert max((g_other[n] - g_peft[n]).norm() / g_peft[n].norm() for n in g_peft) > 1e4 * SAME_MATH


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
    assert loss_fused == pytest.approx(loss_peft, rel=BF16_LOSS)
    assert_grads_close(g_fused, g_peft, BF16_GRADS)


@pytest.mark.gpu
@requires_cuda
def test_seeded_dropout_replays_its_mask_on_gpu():
    """The Triton dropout keeps ~1-p of the elements, scaled by 1/(1-p), the same ones for the same
    seed (forward, its replay, and the backward's masked add), other ones for another seed."""
    from lorabench.fast.kernels import dropout as dk

    x = torch.randn(3000, 4096, device="cuda", dtype=torch.bfloat16)
    y = dk.dropout(x, 7, 0.1)
    keep = y != 0
    assert abs(keep.float().mean().item() - 0.9) < 1e-3
    torch.testing.assert_close(y[keep], (x / 0.9).to(torch.bfloat16)[keep])
    assert torch.equal(dk.dropout(x, 7, 0.1), y)
    assert (dk.dropout(x, 8, 0.1) != 0).ne(keep).float().mean() > 0.1
    acc = torch.ones_like(x)
    dk.add_dropped(acc, x, 7, 0.1)
    torch.testing.assert_close(acc, (1 + x * keep / 0.9).to(torch.bfloat16), rtol=1e-2, atol=1e-2)
    # the seed read from device memory (lorabench.fast.graphs' slots) draws the mask of the same int, bit for bit
    slot = torch.tensor([7], device="cuda")
    assert torch.equal(dk.dropout(x, slot, 0.1), y)
    acc_slot = torch.ones_like(x)
    dk.add_dropped(acc_slot, x, slot, 0.1)
    assert torch.equal(acc_slot, acc)


@pytest.mark.gpu
@requires_cuda
def test_fused_lora_with_seeded_dropout_matches_its_mask_on_gpu(monkeypatch):
    """The Function's CUDA path (seeds, no mask kept) against its mask path given the masks the
    seeds draw: the same outputs and gradients (bf16)."""
    from lorabench.fast.kernels import dropout as dk

    torch.manual_seed(0)
    base = nn.Linear(256, 192, bias=False).cuda().to(torch.bfloat16)
    from peft import LoraConfig, get_peft_model

    net = get_peft_model(nn.Sequential(base), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.2,
                                                         target_modules=["0"]))
    lora = net.base_model.model[0]
    nn.init.normal_(lora.lora_B["default"].weight, std=0.1)
    group = (fused.Projection(base=lora.get_base_layer(), lora=lora),)
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def run():
        torch.manual_seed(5)
        (y,) = fused.project(x, group, training=True, seeded=True)
        y.float().square().sum().backward()
        out = (y.detach(), x.grad.clone(), lora.lora_A["default"].weight.grad.clone())
        x.grad = lora.lora_A["default"].weight.grad = lora.lora_B["default"].weight.grad = None
        return out

    seeded = run()
    torch.manual_seed(5)
    seed = int(torch.randint(2**31 - 1, (1,)))
    mask = dk.dropout(torch.ones_like(x), seed, 0.2) != 0
    monkeypatch.setattr(fused, "_dropout", lambda x2, p, seeded, slot=None: (x2 * mask / (1 - p), mask))
    for a, b in zip(seeded, run()):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_adapters_cast_once_a_step_give_the_casts_bits(dropout):
    """bf16 on CPU: the Function's outputs and gradients with the adapters read from flat_optim's copy cast
    once a step equal those with each adapter cast at its use, bit for bit; after an optimizer step the
    copy holds the new values (the outputs move with the adapters)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = nn.Sequential()
    for name, out in (("q", 64), ("k", 32), ("o", 64)):
        model.add_module(name, nn.Linear(64, out, bias=False))
    model = get_peft_model(model.to(torch.bfloat16), LoraConfig(r=4, target_modules=["q", "k", "o"],
                                                                lora_dropout=dropout, init_lora_weights=False))
    model.float()  # fp32 adapters, as QLoRA keeps them; the Function computes in x's dtype
    qk = tuple(fused._split(model.base_model.model[i]) for i in (0, 1))
    o = (fused._split(model.base_model.model[2]),)
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)

    def run():
        torch.manual_seed(1)  # the dropout masks
        xg = x.clone().requires_grad_()
        ys = fused.project(xg, qk, training=True) + fused.project(xg[..., :64], o, training=True)
        sum((y.float() * (i + 1)).sum() for i, y in enumerate(ys)).backward()
        grads = [xg.grad] + [p.grad.clone() for p in model.parameters() if p.requires_grad]
        model.zero_grad()
        return [y.detach() for y in ys], grads

    ys, grads = run()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    assert flat_optim.flatten(opt) == 6
    ys_flat, grads_flat = run()
    for a, b in zip(ys + grads, ys_flat + grads_flat):
        assert a.dtype == b.dtype and torch.equal(a, b)
    copy, _ = model.base_model.model[0].lora_A["default"].weight.lorabench_low
    assert copy.fresh == {torch.bfloat16}
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p.requires_grad else None
    opt.step()
    assert copy.fresh == set()  # stale until its next use
    ys_next, _ = run()
    assert not torch.equal(ys_next[0], ys[0])
    a = model.base_model.model[0].lora_A["default"].weight
    assert torch.equal(flat_optim.low(a, torch.bfloat16), a.detach().to(torch.bfloat16))
