"""The fifth round's pieces of backend=fast: the MLP through lorabench.fast.fused (backend.fused_mlp), the
Trainer's per-step host work cut (backend.lean_step), nf4 dequantised in Triton (backend.triton_dequant),
Liger's RMSNorm backward on a full grid (backend.norm_backward_grid) and the attention's residual add
inside the next RMSNorm (backend.fused_add_norm). Each must compute what the
path it replaces computes."""

import pytest
import torch
from conftest import (
    BF16_GRADS,
    BF16_LOSS,
    EPS64,
    FAST,
    SAME_MATH,
    assert_grads_close,
    compose_cfg,
    lora_grads,
    read_steps,
    requires_cuda,
    run_in_process,
    spy,
)
from omegaconf import OmegaConf
from torch import nn

from lorabench.fast import fused
from lorabench.fast.kernels import norm as norm_kernels
from lorabench.run import checks
from lorabench.run.trainer import lean_step


@pytest.mark.parametrize("targets,dropout", [("[q_proj,k_proj,v_proj,o_proj]", 0.0),
                                             ("[all-linear]", 0.1)])
def test_fused_mlp_matches_the_mlp_on_cpu(same_masks, monkeypatch, float64, targets, dropout):  # noqa: F811
    """float64 on CPU, half the layers checkpointed: the loss and every LoRA gradient (relative to its
    norm) within SAME_MATH, the MLP without adapters (the seed's q/k/v/o) and with them (all-linear,
    dropout 0.1); the MLP's calls go through the Function (2 layers x 2 groups)."""
    cpu = torch.device("cpu")
    opt = [f"lora.target_modules={targets}", f"lora.dropout={dropout}", "backend.fused_lora=true",
           "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    loss_ref, g_ref, _ = lora_grads(opt, cpu)
    calls = spy(monkeypatch, fused, "_mlp_forward")
    loss, g, _ = lora_grads([*opt, "backend.fused_mlp=true"], cpu)
    assert loss == pytest.approx(loss_ref, rel=SAME_MATH)
    assert_grads_close(g, g_ref, SAME_MATH)
    assert len(calls) == 3  # 2 layers' forwards and the checkpointed layer's recompute
    if targets == "[all-linear]":
        assert any("mlp.down_proj.lora_A" in n for n in g)  # the MLP's adapters were compared too


def test_fused_add_norm_layer_computes_the_layer_on_cpu(monkeypatch, float64):
    """The patched decoder layer (on CPU the add and the norm stay apart, as transformers has them):
    the same loss and gradients (float64, within SAME_MATH), half the layers checkpointed, every
    layer through it."""
    cpu = torch.device("cpu")
    opt = ["train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5", "backend.fused_lora=true"]
    loss_ref, g_ref, _ = lora_grads(opt, cpu)
    calls = spy(monkeypatch, norm_kernels, "add_rms_norm")
    loss, g, _ = lora_grads([*opt, "backend.fused_add_norm=true"], cpu)
    assert loss == pytest.approx(loss_ref, rel=SAME_MATH)
    assert_grads_close(g, g_ref, SAME_MATH)
    assert len(calls) == 3  # 2 layers and the checkpointed one's recompute


def _saved_bytes(model, x) -> int:
    """Bytes autograd keeps for the backward of model(x), each storage counted once."""
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x).sum().backward()
    return sum(seen.values())


def test_fused_mlp_keeps_no_more_than_the_mlp():
    """Without adapters the Function keeps nothing of its input (bitsandbytes' matmul keeps only
    the weight): the patched MLP keeps at most what the plain one keeps, and computes the same
    (float64: the two differ in summation order only)."""
    from transformers import MistralConfig
    from transformers.models.mistral.modeling_mistral import MistralMLP

    torch.manual_seed(0)
    cfg = MistralConfig(hidden_size=64, intermediate_size=192)
    plain = MistralMLP(cfg).requires_grad_(False).double()
    patched = MistralMLP(cfg).requires_grad_(False).double()
    patched.load_state_dict(plain.state_dict())
    layer = nn.Module()
    layer.mlp = patched
    fused.patch_mlp([layer], seeded_dropout=False)
    x = torch.randn(4, 16, 64, dtype=torch.float64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    assert _saved_bytes(patched, x2) <= _saved_bytes(plain, x)
    # Each output and input-gradient element is a chain of sums of 64 (gate, up) and 192 (down) products,
    # each sum within n x eps of the sum of its terms' magnitudes; with those taken at the largest
    # element's size, (64 + 192) x eps64 of it (5.7e-14 relative) bounds what two summation orders can
    # differ by. A wrong formula is off by the order of the element itself.
    for got, want in ((patched(x2), plain(x)), (x2.grad, x.grad)):  # (_saved_bytes ran the backwards)
        torch.testing.assert_close(got, want, rtol=0, atol=(64 + 192) * EPS64 * want.abs().max().item())


def test_fused_mlp_keeps_ligers_swiglu_for_each_mlp_class_liger_binds(monkeypatch):
    """fused_mlp computes act(gate) * up as the MLP did: through Liger's SwiGLU kernel wherever Liger's patch bound
    one of its SwiGLU classes on the MLP (Qwen3.5's dense MLP takes Qwen3-MoE's class), else the model's act_fn and
    a multiply. A stand-in for Liger's module: its kernels need CUDA."""
    import sys
    import types

    kernel = lambda gate, up: gate * up  # noqa: E731  (Liger's dispatch, by identity)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.swiglu", types.SimpleNamespace(_swiglu_dispatch=kernel))
    mlp = nn.Module()
    mlp.act_fn = nn.SiLU()
    for name in ("LigerSwiGLUMLP", "LigerPhi3SwiGLUMLP", "LigerQwen3MoeSwiGLUMLP"):
        mlp._get_name = lambda name=name: name  # as Liger's patch rebinds it on the instance
        assert fused._activation(mlp) is kernel, name
    mlp._get_name = lambda: "Qwen3_5MLP"  # no Liger patch: silu(gate) * up in PyTorch
    gate, up = torch.randn(3, 4), torch.randn(3, 4)
    assert fused._activation(mlp) is not kernel
    assert torch.equal(fused._activation(mlp)(gate, up), nn.functional.silu(gate) * up)


def test_fused_mlp_is_refused_with_int8_and_unsloth_by_name():
    c = OmegaConf.to_object(compose_cfg(["backend.fused_mlp=true", "precision=int8"]))
    with pytest.raises(ValueError, match="backend.fused_mlp=true .* not precision=int8"):
        checks.check_values(c)
    for knob in ("fused_mlp", "fused_add_norm"):
        c = OmegaConf.to_object(compose_cfg(["backend=unsloth", f"backend.{knob}=true"]))
        with pytest.raises(ValueError, match=f"{knob}=True"):
            checks.check_values(c)


class _Counted(nn.Sequential):
    """A model with transformers' parameter count (its walk over the modules counted)."""
    walks = 0

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        self.walks += 1
        return sum(p.numel() for p in self.parameters())


def test_lean_step_clears_only_trainable_grads_and_walks_modules_on_a_mode_change(monkeypatch):
    model = _Counted(nn.Linear(4, 4), nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))
    model[0].requires_grad_(False)
    walks = []
    inner_train = nn.Module.train
    monkeypatch.setattr(nn.Dropout, "train", lambda self, mode=True: walks.append(mode) or inner_train(self, mode))
    lean_step(model)
    model(torch.randn(2, 4)).sum().backward()
    assert model[1][0].weight.grad is not None
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    model.train(), model.train(), model.train()
    assert walks == [True]  # one walk for three calls in the same mode
    model.eval()
    assert walks == [True, False] and not model[1][1].training
    model.train()
    assert walks == [True, False, True] and all(m.training for m in model.modules())
    # the Trainer's flop count at every step: the same count, the modules walked once
    assert [model.num_parameters(exclude_embeddings=True) for _ in range(3)] == [40] * 3 and model.walks == 1


@pytest.mark.slow  # make test-slow (CI runs it): kept out of make test's 150 s on 2 cores
def test_a_cell_with_lean_step_and_fused_mlp_trains_as_without_them(tmp_path, float64):
    """The tiny cell (float64, CPU): every step's loss equals the cell's without the two options within
    SAME_MATH. In fp32 the two trajectories part at round-off (1e-6 to 5e-6 over 8 steps on an AMD
    EPYC, depending on the thread count: Adam's early steps amplify it), which no machine-independent
    bound covers; in float64 what remains is the fp32 rounding of transformers' casts (the steps'
    losses are fp32 values: equal here to the last bit)."""
    losses = {}
    for on in (False, True):
        r = run_in_process([*FAST, "backend.fused_lora=true", f"backend.lean_step={on}",
                            f"backend.fused_mlp={on}"], tmp_path / str(on))
        assert r.status.value == "ok", r.error
        losses[on] = [s["loss"] for s in read_steps(tmp_path / str(on))]
    assert losses[True] == pytest.approx(losses[False], rel=SAME_MATH, abs=0) and len(set(losses[True])) > 1


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("nested", [False, True])
def test_triton_dequant_is_bitsandbytes_bit_for_bit_on_gpu(nested):
    """Mistral's and Qwen2.5's shapes (a program of 1,024 packed bytes up to 16M weights, of 4,096 above), an odd
    one, one whose last quantisation block is cut short, and 128-weight blocks, with and without double
    quantisation: the same bf16 bits, the double quantisation undone inside the kernel (nothing kept) and from kept
    fp32 scales."""
    import bitsandbytes.functional as bnbf

    from lorabench.fast.kernels import nf4 as nf4_kernels

    torch.manual_seed(0)
    for shape, blocksize in [((4096, 4096), 64), ((1024, 4096), 64), ((14336, 4096), 64), ((4096, 14336), 64),
                             ((3584, 18944), 64), ((96, 200), 64), ((100, 30), 64), ((512, 3584), 128)]:
        w = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        q, state = bnbf.quantize_4bit(w, blocksize=blocksize, quant_type="nf4", compress_statistics=nested)
        assert nf4_kernels.runs(q, state)
        reference = bnbf.dequantize_4bit(q, state)
        assert torch.equal(nf4_kernels.dequantize(q, state), reference), shape
        assert not hasattr(state, "lorabench_absmax")
        for _ in range(2):  # the kept scales: computed, then reused
            assert torch.equal(nf4_kernels.dequantize(q, state, keep_absmax=True), reference), shape
        assert hasattr(state, "lorabench_absmax") == nested


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("casting", ["llama", "gemma"])
def test_norm_backward_grid_gives_liger_s_bits_on_gpu(monkeypatch, casting):
    """Liger's RMSNorm with a frozen weight, [3 x 2000 x 4096] bf16 (Llama's casting; Gemma's, with its +1
    offset): the same Y and dX bits through lorabench's launches (_FrozenRMSNorm: forward kernel, backward on
    the full grid) as through Liger's own, and Liger's own launches where the weight trains."""
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    from lorabench.fast.kernels import norm as norm_kernels

    torch.manual_seed(0)
    offset = 1.0 if casting == "gemma" else 0.0
    norm = LigerRMSNorm(4096, offset=offset, casting_mode=casting, init_fn="ones").cuda().to(torch.bfloat16)
    nn.init.normal_(norm.weight, 1.0 - offset, 0.1)
    x = torch.randn(3, 2000, 4096, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    lean = spy(monkeypatch, norm_kernels._FrozenRMSNorm, "apply")

    def run(frozen: bool, grid: bool):
        norm.weight.requires_grad_(not frozen)
        xi = x.clone().requires_grad_(True)
        with norm_kernels.frozen_weight_grid(grid):
            y = norm(xi)
            y.backward(dy.clone())
        return y.detach(), xi.grad

    for a, b in zip(run(True, True), run(True, False)):
        assert torch.equal(a, b)
    assert len(lean) == 1  # the frozen cell with the context on
    for a, b in zip(run(False, True), run(False, False)):
        assert torch.equal(a, b)
    assert len(lean) == 1


@pytest.mark.gpu
@requires_cuda
def test_fused_add_norm_on_gpu_matches_the_add_and_the_norm():
    """Liger's fused add + RMSNorm as add_rms_norm runs it, [3 x 2000 x 4096] bf16, frozen weight: the
    norm's output and the sum bit for bit the unfused ones; the input gradients within bf16 rounding
    (the fused backward adds the residual's gradient before rounding); the full grid gives Liger's bits."""
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    torch.manual_seed(0)
    norm = LigerRMSNorm(4096).cuda().to(torch.bfloat16).requires_grad_(False)
    nn.init.normal_(norm.weight, 1.0, 0.1)
    x, r = (torch.randn(3, 2000, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dy, ds = torch.randn_like(x), torch.randn_like(x)

    def run(fused_add: bool, grid: bool):
        xi, ri = x.clone().requires_grad_(True), r.clone().requires_grad_(True)
        with norm_kernels.frozen_weight_grid(grid):
            if fused_add:
                y, s = norm_kernels.add_rms_norm(xi, ri, norm)
            else:
                s = ri + xi
                y = norm(s)
            torch.autograd.backward([y, s], [dy.clone(), ds.clone()])
        return y.detach(), s.detach(), xi.grad, ri.grad

    fused_grid, fused_liger, apart = run(True, True), run(True, False), run(False, True)
    assert all(torch.equal(a, b) for a, b in zip(fused_grid, fused_liger))
    assert torch.equal(fused_grid[0], apart[0]) and torch.equal(fused_grid[1], apart[1])
    torch.testing.assert_close(fused_grid[2], apart[2], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(fused_grid[3], fused_grid[2], rtol=0, atol=0)


@pytest.mark.gpu
@requires_cuda
def test_fast_with_the_mlp_fused_and_triton_dequant_matches_without_on_gpu(monkeypatch):
    """backend=fast (Liger's SwiGLU and RMSNorm, nf4) with fused_mlp, triton_dequant and fused_add_norm
    against without: loss to
    1% and LoRA gradients to 3% of their norms (bf16 summation order), Liger's SwiGLU kept."""
    from liger_kernel.transformers import swiglu

    cuda = torch.device("cuda", 0)
    opt = ["backend=fast", "precision=nf4", "optimizer=adamw_torch", "lora.dropout=0"]
    loss_ref, g_ref, _ = lora_grads([*opt, "backend.fused_mlp=false", "backend.triton_dequant=false",
                                     "backend.fused_add_norm=false"], cuda)
    acts = spy(monkeypatch, fused, "_activation")
    loss, g, _ = lora_grads(opt, cuda)
    assert acts and all(a is swiglu._swiglu_dispatch for a in acts)
    assert loss == pytest.approx(loss_ref, rel=BF16_LOSS)
    assert_grads_close(g, g_ref, BF16_GRADS)


def test_ce_chunk_mem_reaches_ligers_fused_loss_for_the_cell_and_is_undone(monkeypatch):
    """Every architecture's Liger forward calls liger_kernel.transformers.functional's fused linear
    cross-entropy without chunk_mem_const: the cell's backend.ce_chunk_mem is passed to it while the cell
    runs, the keywords its callers filter by stay its own, and the module is as it was after (or stays
    untouched at Liger's own 1). A stand-in module: Liger's kernels need CUDA."""
    import inspect
    import sys
    import types

    from lorabench.fast import parts

    def flce(input, weight, target, bias=None, reduction="mean", chunk_mem_const=1):
        return chunk_mem_const

    functional = types.SimpleNamespace(liger_fused_linear_cross_entropy=flce)
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.functional", functional)
    cfg = lambda *o: OmegaConf.to_object(compose_cfg(["backend=fast", *o]))  # noqa: E731
    with parts._loss_head(cfg("backend.ce_chunk_mem=8")):
        assert functional.liger_fused_linear_cross_entropy(None, None, None) == 8
        assert list(inspect.signature(functional.liger_fused_linear_cross_entropy).parameters) == \
            ["input", "weight", "target", "bias", "reduction", "chunk_mem_const"]
    assert functional.liger_fused_linear_cross_entropy is flce
    for off in ("backend.ce_chunk_mem=1", "backend.liger=[rms_norm]"):  # Liger's chunking; no fused loss
        with parts._loss_head(cfg(off)):
            assert functional.liger_fused_linear_cross_entropy is flce
    functional.liger_fused_linear_cross_entropy = lambda input, weight, target: 1  # a Liger without the knob
    with pytest.raises(RuntimeError,
                       match=r"backend.ce_chunk_mem=8 backend.loss_on_device=false: .* takes no chunk_mem_const"):
        with parts._loss_head(cfg("backend.ce_chunk_mem=8")):
            pass
    assert [p.key for p in parts.parts_on(cfg("backend.liger=[]", "backend.ce_chunk_mem=8"))].count("ce_chunk_mem") == 1
    assert "ce_chunk_mem" not in [p.key for p in parts.parts_on(cfg("backend.liger=[]", "backend.ce_chunk_mem=1"))]
