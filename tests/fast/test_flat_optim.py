"""The adapters as one flat tensor for the optimizer (lorabench.fast.flat_optim, backend.flat_optimizer):
the same updates as tensor by tensor, bit for bit, in fewer tensors; a cell trains as without it."""

import bitsandbytes as bnb
import pytest
import torch
from conftest import FAST, compose_cfg, read_steps, requires_cuda, run_in_process, spy
from omegaconf import OmegaConf

from lorabench.fast import flat_optim
from lorabench.run import checks

# LoRA r16 on a 4096-wide model: A [16 x 4096], B of q/o [4096 x 16], B of k/v [1024 x 16]; then
# tensors bitsandbytes' 8-bit path treats apart: 2,048 elements (32-bit states) and 300 (not whole blocks).
SHAPES = [(16, 4096), (4096, 16), (16, 4096), (1024, 16), (16, 128), (300,)]


def train(optimizer_cls, flat: bool, device="cpu", steps=4, **kw):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, device=device)) for s in SHAPES]
    opt = optimizer_cls(params, lr=1e-2, weight_decay=0.01, **kw)
    joined = flat_optim.flatten(opt) if flat else 0
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device)
        opt.step()
        opt.zero_grad()
    return params, opt, joined


@pytest.mark.parametrize("optimizer_cls", [bnb.optim.PagedAdamW8bit, bnb.optim.AdamW32bit, torch.optim.AdamW],
                         ids=["paged_adamw_8bit", "bnb_adamw_32bit", "adamw_torch"])
def test_flat_updates_equal_the_per_tensor_ones_bit_for_bit(optimizer_cls):
    kw = {"foreach": False} if optimizer_cls is torch.optim.AdamW else {}  # one code path on both sides
    reference, ref_opt, _ = train(optimizer_cls, flat=False, **kw)
    params, opt, joined = train(optimizer_cls, flat=True, **kw)
    for a, b in zip(params, reference):
        assert torch.equal(a, b)
    assert not torch.equal(params[0], train(optimizer_cls, flat=True, steps=0, **kw)[0][0])  # they moved
    # 8-bit: the four LoRA-sized tensors join; 2,048 and 300 elements stay apart. Elsewhere all join.
    tensors = [p for group in opt.param_groups for p in group["params"]]
    if optimizer_cls is bnb.optim.PagedAdamW8bit:
        assert joined == 4 and [t.numel() for t in tensors] == [2048, 300, sum(p.numel() for p in params[:4])]
    else:
        assert joined == len(SHAPES) and len(tensors) == 1
    flat = tensors[-1]  # the model's tensors are views into the optimizer's one
    assert params[0].data_ptr() == flat.data_ptr() and flat.grad is None
    assert len([p for p in ref_opt.param_groups[0]["params"]]) == len(SHAPES)


def test_optimizers_that_are_not_elementwise_are_refused_by_name():
    from transformers.optimization import Adafactor

    opt = Adafactor([torch.nn.Parameter(torch.zeros(256))], lr=1e-3, relative_step=False, scale_parameter=False)
    with pytest.raises(ValueError, match="Adafactor does not update each element on its own"):
        flat_optim.flatten(opt)
    c = OmegaConf.to_object(compose_cfg(["optimizer=adafactor", "backend.flat_optimizer=true"]))
    with pytest.raises(ValueError, match="backend.flat_optimizer=true with optimizer=adafactor"):
        checks.check_values(c)


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_a_cell_with_the_flat_optimizer_trains_as_without_it(tmp_path, monkeypatch):
    """The tiny model's adapters (2 layers x 4 projections x A, B; adamw_torch) in one tensor: the
    losses of every step equal those of the cell without it, so its gradients reached the update."""
    joined = spy(monkeypatch, flat_optim, "flatten")
    losses = {}
    for flat in (False, True):
        r = run_in_process([*FAST, "train.max_steps=8", f"backend.flat_optimizer={flat}"], tmp_path / str(flat))
        assert r.status.value == "ok", r.error
        losses[flat] = [s["loss"] for s in read_steps(tmp_path / str(flat))]
    assert joined == [16]  # only the cell that asked for it
    assert losses[True] == losses[False] and len(set(losses[True])) > 1


@pytest.mark.gpu
@requires_cuda
def test_flat_paged_adamw_8bit_equals_per_tensor_on_gpu():
    reference, _, _ = train(bnb.optim.PagedAdamW8bit, flat=False, device="cuda")
    params, _, joined = train(bnb.optim.PagedAdamW8bit, flat=True, device="cuda")
    assert joined == 4 and all(torch.equal(a, b) for a, b in zip(params, reference))
