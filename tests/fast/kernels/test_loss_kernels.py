"""The fused linear cross-entropy without host round trips (backend.loss_on_device, lorabench.fast.kernels.loss):
the loss and input gradient of cross_entropy(x @ W.T) chunk by chunk, the calls it does not compute handed to
Liger's own function, and on a GPU Liger's bits without a single wait for the device."""

import pytest
import torch
from conftest import BF16_GRADS, BF16_LOSS, EPS32, assert_grads_close, compose_cfg, lora_grads, requires_cuda
from omegaconf import OmegaConf

from lorabench.fast.kernels import loss as loss_kernels


def _torch_row_losses(logits, target, losses, ignore_index, softcap):
    """What Liger's kernel computes with reduction "sum", in PyTorch: each row's loss, and its logits'
    gradient written over them (zero on an ignored row)."""
    z = logits if softcap is None else softcap * torch.tanh(logits / softcap)
    keep = target != ignore_index
    safe = torch.where(keep, target, 0)
    lse = torch.logsumexp(z, dim=-1)
    losses.copy_(torch.where(keep, lse - z.gather(1, safe[:, None])[:, 0], 0))
    dz = torch.softmax(z, dim=-1) - torch.nn.functional.one_hot(safe, z.shape[1]).to(z.dtype)
    if softcap is not None:
        dz = dz * (1 - torch.tanh(logits / softcap) ** 2)
    logits.copy_(dz * keep[:, None])


def _torch_scale(grad, upstream):
    grad.mul_(upstream)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_summed_loss_is_cross_entropy_chunk_by_chunk_on_cpu(monkeypatch, softcap):
    """float64, 100 tokens in chunks of 8 rows, the last of 4 (chunk_mem 4: 100 / ceil(512 / 32) rounded up to a
    power of 2): the summed loss and the input's gradient, scaled by a mean's 1/count in the backward, are
    PyTorch's cross-entropy's over the whole logits, ignored tokens left out."""
    monkeypatch.setattr(loss_kernels, "_row_losses", _torch_row_losses)
    monkeypatch.setattr(loss_kernels, "_scale", _torch_scale)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 8, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(512, 8, dtype=torch.float64, generator=g)
    target = torch.randint(0, 512, (100,), generator=g)
    target[::7] = -100
    assert loss_kernels.chunk_rows(100, 512, 8, 1) == 2  # 100 / ceil(512 / 8) rounded up to a power of 2
    assert loss_kernels.chunk_rows(4096, 152064, 3584, 8) == 1024  # Qwen2.5-7B at fast's ce_chunk_mem
    assert loss_kernels.chunk_rows(100, 512, 8, 4) == 8
    total = loss_kernels.SummedLoss.apply(x, w, target, -100, softcap, 4)
    mean = total / (target != -100).sum()
    mean.backward()
    xr = x.detach().clone().requires_grad_()
    logits = xr @ w.T if softcap is None else softcap * torch.tanh(xr @ w.T / softcap)
    ref = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)
    ref.backward()
    # The row losses are kept in fp32, as Liger keeps them: one rounding each and 100 in the sum; the gradient
    # is float64 but for its scale 1 / count, the fp32 loss's gradient: one fp32 rounding.
    assert mean.item() == pytest.approx(ref.item(), rel=2 * 100 * EPS32)
    assert_grads_close({"x": x.grad}, {"x": xr.grad}, 2 * EPS32)
    assert x.grad[::7].abs().max() == 0  # an ignored token has no gradient


def test_calls_it_does_not_compute_go_to_ligers_function():
    """CPU tensors, a bias, label smoothing, z-loss, reduction "none" or a trainable head: Liger's own function gets
    the call with every keyword as given, and its result is returned as it is."""
    seen = []

    def liger(*args, **kw):
        seen.append((args, kw))
        return "liger's"

    x, w, t = torch.zeros(4, 2), torch.zeros(3, 2), torch.zeros(4, dtype=torch.long)
    assert loss_kernels.fused_linear_cross_entropy(x, w, t, liger=liger, chunk_mem_const=8, softcap=30.0) == "liger's"
    assert seen[0][0] == (x, w, t) and seen[0][1]["chunk_mem_const"] == 8 and seen[0][1]["softcap"] == 30.0
    assert seen[0][1]["reduction"] == "mean" and seen[0][1]["bias"] is None
    options = dict(seen[0][1])
    assert loss_kernels.computes(x, w, options)  # on CUDA it would compute this one
    for change in ({"bias": torch.zeros(3)}, {"label_smoothing": 0.1}, {"return_z_loss": True},
                   {"reduction": "none"}):
        assert not loss_kernels.computes(x, w, {**options, **change}), change
    assert not loss_kernels.computes(x, w.clone().requires_grad_(), options)


def test_a_liger_whose_kernel_takes_other_arguments_is_named(monkeypatch):
    """The kernel's arguments are checked before the first call: 0.8.5's pass, another set is named in one line."""
    import sys
    import types

    kernel = types.SimpleNamespace(arg_names=list(loss_kernels.KERNEL_ARGS))
    monkeypatch.setitem(sys.modules, "liger_kernel.ops.cross_entropy",
                        types.SimpleNamespace(liger_cross_entropy_kernel=kernel))
    assert loss_kernels.kernel_differs() is None
    kernel.arg_names = [*loss_kernels.KERNEL_ARGS[:-1], "HAS_NEW_THING"]
    differs = loss_kernels.kernel_differs()
    assert "HAS_NEW_THING" in differs and "not 0.8.5's" in differs and "\n" not in differs


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_loss_on_device_is_ligers_loss_without_a_sync_on_gpu(reduction):
    """Qwen2.5-7B's head at 2,048 tokens (152,064 x 3,584, bf16, chunk_mem 8): with reduction "sum" (what the
    Trainer asks for), divided by its count as loss_utils does, the loss and the input gradient have Liger's bits;
    with "mean" the loss is Liger's to fp32 rounding over the rows. Forward and backward run with CUDA's sync
    debug mode set to raise on any wait for the device; Liger's own raises there."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy as liger

    cuda = torch.device("cuda")
    g = torch.Generator(cuda).manual_seed(0)
    x = torch.randn(2048, 3584, device=cuda, dtype=torch.bfloat16, generator=g).requires_grad_()
    w = torch.randn(152064, 3584, device=cuda, dtype=torch.bfloat16, generator=g) * 0.02
    target = torch.randint(0, 152064, (2048,), device=cuda, generator=g)
    target[:100] = -100
    count = (target != -100).sum()

    def run(fn, debug):
        x.grad = None
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(debug)
        try:
            loss = fn(x, w, target, reduction=reduction, chunk_mem_const=8)
            loss = loss / count if reduction == "sum" else loss
            loss.backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        return loss.detach(), x.grad.clone()

    loss_ref, grad_ref = run(liger, 0)
    with pytest.raises(RuntimeError, match="synchroniz"):
        run(liger, "error")
    loss, grad = run(lambda *a, **k: loss_kernels.fused_linear_cross_entropy(*a, **k, liger=liger), "error")
    if reduction == "sum":
        assert torch.equal(loss, loss_ref) and torch.equal(grad, grad_ref)
    else:
        assert loss.item() == pytest.approx(loss_ref.item(), rel=2048 * torch.finfo(torch.float32).eps)
        # Liger scales each row's logit gradient before its bf16 rounding, this after the GEMM: one more bf16
        # rounding on this side
        assert_grads_close({"x": grad.double()}, {"x": grad_ref.double()}, 2 * torch.finfo(torch.bfloat16).eps)


@pytest.mark.gpu
@requires_cuda
def test_fast_with_loss_on_device_matches_without_on_gpu():
    """A fast cell's loss and LoRA gradients (tiny model, nf4) with backend.loss_on_device and without it: within
    one bf16 rounding per side (the two only differ where the Trainer's mean is divided: fp32 rounding)."""
    cuda = torch.device("cuda", 0)
    opt = ["backend=fast", "precision=nf4", "optimizer=adamw_torch", "lora.dropout=0", "backend.cuda_graphs=false"]
    loss_ref, g_ref, _ = lora_grads([*opt, "backend.loss_on_device=false"], cuda)
    loss, g, _ = lora_grads([*opt, "backend.loss_on_device=true"], cuda)
    assert loss == pytest.approx(loss_ref, rel=BF16_LOSS)
    assert_grads_close(g, g_ref, BF16_GRADS)


def test_loss_on_device_is_a_part_through_liger():
    """backend=fast turns it on; without Liger's ops it acts through nothing (listed once, never on alone)."""
    from lorabench.fast import parts

    cfg = lambda *o: OmegaConf.to_object(compose_cfg(["backend=fast", *o]))  # noqa: E731
    assert cfg().backend.loss_on_device
    assert parts.PART["loss_on_device"].through == ("liger",)
    assert parts.PART["loss_on_device"].reaches(cfg()) and not parts.PART["loss_on_device"].reaches(
        cfg("backend.liger=[]"))
