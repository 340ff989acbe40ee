"""Saved activations of chosen layers in host memory between the passes (lorabench.fast.offload,
train.offload_fraction): the same gradients to the bit, the layers the plan names, the values refused."""

import pytest
import torch
from conftest import compose_cfg, lora_grads, requires_cuda, spy
from omegaconf import OmegaConf

from lorabench.fast import offload
from lorabench.run import backends, checks
from lorabench.run.loop import build_trainable_model


def test_layer_plan_interleaves_offloaded_with_recomputed_layers_from_the_bottom():
    r, o, k = "r", "o", "k"
    short = lambda plan: "".join(how[0] for how in plan)  # noqa: E731
    assert short(offload.layer_plan(32, 20, 0)) == r * 20 + k * 12  # checkpoint_fraction alone: as before
    assert short(offload.layer_plan(8, 3, 3)) == "rorororo"[:6] + "kk"
    assert short(offload.layer_plan(8, 2, 4)) == "roorookk"
    assert short(offload.layer_plan(4, 0, 4)) == "oooo"
    with pytest.raises(ValueError, match="more than 4"):
        offload.layer_plan(4, 3, 2)


def test_offload_fraction_takes_only_unrecomputed_layers():
    c = OmegaConf.to_object(compose_cfg(["model.num_hidden_layers=4", "train.gradient_checkpointing=true",
                                         "train.checkpoint_fraction=0.25", "train.offload_fraction=0.5"]))
    model, _, (recomputed, offloaded) = build_trainable_model(c, torch.device("cpu"))
    layers = backends.decoder_layers(model)
    assert (recomputed, offloaded) == (1, 2)
    assert [layer.gradient_checkpointing for layer in layers] == [True, False, False, False]
    assert [layer.forward.__name__ for layer in layers] == ["forward", "offloaded", "offloaded", "forward"]
    too_many = compose_cfg(["train.gradient_checkpointing=true", "train.checkpoint_fraction=0.75",
                            "train.offload_fraction=0.5"])
    with pytest.raises(ValueError, match=r"offload_fraction must be in \[0, 1 - recomputed fraction = 0.25\].*got 0.5"):
        OmegaConf.to_object(too_many)
    c = OmegaConf.to_object(compose_cfg(["backend=unsloth", "train.offload_fraction=0.5"]))
    with pytest.raises(ValueError, match="train.offload_fraction=0.5 is lorabench's"):
        checks.check_values(c)


@pytest.fixture
def offloaders(monkeypatch):
    """Every Offloader a model build makes (None where it offloads nothing); no size floor: tiny model."""
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    return spy(monkeypatch, offload, "apply")


def _grads_with_and_without_offload(device, overrides=()):
    opt = ["model.num_hidden_layers=4", "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.25",
           "lora.dropout=0.1", *overrides]
    loss_kept, kept, _ = lora_grads(opt, device)  # (each seeds torch's generator the same way)
    loss_off, off, _ = lora_grads([*opt, "train.offload_fraction=0.5"], device)
    return (loss_kept, kept), (loss_off, off)


def test_views_of_one_buffer_travel_once_and_come_back_as_they_were(monkeypatch):
    monkeypatch.setattr(offload, "MIN_BYTES", 0)
    off = offload.Offloader(torch.device("cpu"))
    base = torch.randn(8, 6)
    # base and its transpose share the buffer; the slice and the column hold a quarter and a sixth of
    # it, so they travel alone (made contiguous)
    views = [base, base.t(), base[2:4], base[:, 1]]
    packed = [off.pack(0, v) for v in views]
    assert len({id(p.saved) for p in packed}) == 3 and off.peak_bytes == (48 + 12 + 8) * 4
    back = [off.unpack(p) for p in packed]
    assert all(torch.equal(b, v) and b.stride() == v.stride() for b, v in zip(back[:2], views))
    assert all(torch.equal(b, v) for b, v in zip(back, views))


@pytest.mark.parametrize("lookahead", [offload.LOOKAHEAD, 0], ids=["prefetched", "fetched-when-needed"])
def test_offloaded_layers_give_the_same_gradients_to_the_bit(offloaders, monkeypatch, lookahead):
    """Layers 1 and 2 of 4 offloaded (layer 0 recomputed): the loss and every LoRA gradient equal
    the run that keeps them, bit for bit. Prefetched, every tensor is asked for before the backward
    needs it; without lookahead each is fetched when needed (the path a prefetch falls back on)."""
    monkeypatch.setattr(offload, "LOOKAHEAD", lookahead)
    (loss_kept, kept), (loss_off, off) = _grads_with_and_without_offload(torch.device("cpu"))
    (o,) = [o for o in offloaders if o is not None]  # the kept run made none
    assert o.peak_bytes > 0 and not o.waiting  # tensors went out, and all came back
    assert (o.late == 0) == (lookahead > 0)
    assert loss_off == loss_kept
    assert kept.keys() == off.keys() and all(torch.equal(kept[n], off[n]) for n in kept)


@pytest.mark.gpu
@requires_cuda
def test_offloaded_layers_on_gpu_same_gradients_less_memory(offloaders):
    """On CUDA the copies run on side streams: bf16 LoRA gradients equal the kept run's to the bit,
    and after the forward the GPU holds over a quarter less (two of four layers' saved tensors left
    it; the logits and the kept layer stay). With the originals held on (the bug the CPU test
    `..._let_go_...` guards) it held the same."""
    cuda = torch.device("cuda", 0)
    # Layers of 1,024 wide: ~12 MiB of saved tensors each at 4 x 64 tokens.
    opt = ["model.num_hidden_layers=4", "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.25",
           "precision=bf16", "optimizer=adamw_torch", "model.hidden_size=1024", "model.intermediate_size=3584",
           "model.num_attention_heads=8", "model.head_dim=128"]
    (loss_kept, kept), (loss_off, off) = _grads_with_and_without_offload(cuda, opt)
    (o,) = [o for o in offloaders if o is not None]
    assert o.late == 0 and o.peak_bytes > 0
    assert loss_off == loss_kept and all(torch.equal(kept[n], off[n]) for n in kept)
    resident = []
    for extra in ([], ["train.offload_fraction=0.5"]):
        c = OmegaConf.to_object(compose_cfg(["batch=4", *opt, *extra]))
        model, _, _ = build_trainable_model(c, cuda)
        model.train()
        ids = torch.randint(0, 1000, (4, 64), device=cuda)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(cuda)
        with torch.autocast("cuda", torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        torch.cuda.synchronize()
        resident.append(torch.cuda.memory_allocated(cuda) - before)
        del model, loss
    assert offloaders[-1].batch_bytes > 0 and resident[0] - resident[1] > 0.25 * resident[0]


def test_offloaded_originals_are_let_go_when_the_forward_ends(offloaders, monkeypatch):
    """What makes offloading save memory: after the forward nothing holds the tensors that were
    copied out (autograd keeps each pack hook until the backward, so the hook must not hold them);
    and what would save none, the weights the layers save views of, is not copied."""
    import weakref

    originals, sent_storages = [], set()
    pack = offload.Offloader.pack

    def spy(self, *args):
        out, t = pack(self, *args), args[-1]
        if out is not t:
            originals.append(weakref.ref(t))
            sent_storages.add(t.untyped_storage().data_ptr())
        return out

    monkeypatch.setattr(offload.Offloader, "pack", spy)
    c = OmegaConf.to_object(compose_cfg(["model.num_hidden_layers=4", "train.offload_fraction=0.5", "batch=2"]))
    model, _, _ = build_trainable_model(c, torch.device("cpu"))
    model.train()
    ids = torch.randint(0, 1000, (2, 32))
    loss = model(input_ids=ids, labels=ids).loss
    assert originals and not [r for r in originals if r() is not None]
    # nothing of the weights travels (the frozen layers save views of them): they stay on the device
    assert not sent_storages & {p.untyped_storage().data_ptr() for p in model.parameters()}
    loss.backward()
