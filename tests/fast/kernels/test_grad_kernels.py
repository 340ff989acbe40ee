"""The sixth round's pieces of backend=fast: the backward's input gradients as one Triton GEMM per group
(backend.triton_input_grad) and SwiGLU's backward in the down projection's (backend.swiglu_in_gemm).
Each must compute what the path it replaces computes."""

import pytest
import torch
from conftest import BF16_GRADS, BF16_LOSS, EPS64, assert_grads_close, lora_grads, requires_cuda, spy

from lorabench.fast import fused


@pytest.mark.gpu
def test_the_triton_gemm_runs_only_where_its_tiles_fill_the_gpu_with_waves():
    """128 x 256 tiles over an H200's 132 SMs: Qwen2.5-7B's 3,584 features at 4,096 tokens are 448 tiles (3.4
    waves: cuBLAS), at 24,576 tokens 2,688 (20 waves: Triton); 8 waves are 1,056 tiles. (Triton, where the GPU
    tests run, is imported by the module; the rule itself needs no GPU.)"""
    pytest.importorskip("triton")
    from lorabench.fast.kernels import grad as grad_kernels

    assert not grad_kernels.fills(4096, 3584, 132) and grad_kernels.fills(24576, 3584, 132)
    assert grad_kernels.fills(128 * 66, 256 * 16, 132) and not grad_kernels.fills(128 * 66 - 128, 256 * 16, 132)


def test_input_grad_falls_back_to_cublas_on_cpu():
    """On the CPU the grouped backward sums its GEMMs as before, the adapters' G A term included (and
    without Triton installed: lorabench.fast.kernels.grad is imported on CUDA only)."""
    f64 = torch.float64
    group = tuple(fused.Projection(base=torch.nn.Linear(8, n, bias=False, dtype=f64), lora=None, triton_grad=True)
                  for n in (6, 4))
    dys = [torch.randn(5, 6, dtype=f64), torch.randn(5, 4, dtype=f64)]
    g, a = torch.randn(5, 3, dtype=f64), torch.randn(3, 8, dtype=f64)
    dx = fused._input_grad(group, dys, [(g, a)])
    want = dys[0] @ group[0].base.weight + dys[1] @ group[1].base.weight + g @ a
    # Each element sums 6 + 4 + 3 = 13 products, in another order: each result is within 13 eps of the
    # exact sum, relative to the sum of the terms' magnitudes, so the two within twice that.
    magnitude = sum(p.abs() @ q.abs() for p, q in ((dys[0], group[0].base.weight), (dys[1], group[1].base.weight),
                                                    (g, a)))
    assert ((dx - want).abs() <= 2 * 13 * EPS64 * magnitude).all()


@pytest.mark.gpu
@requires_cuda
def test_input_grad_is_the_sum_of_its_gemms_on_gpu(monkeypatch):
    """Tails in every dimension (M = 300, K = 48 and 1000, N = 320): the sum of the products within
    bf16 rounding of the fp32 sum, as close as cuBLAS's chain of addmm_."""
    from lorabench.fast.kernels import grad as grad_kernels

    monkeypatch.setattr(grad_kernels, "MIN_WAVES", 0)  # 6 tiles: far below the waves it takes in a cell
    torch.manual_seed(0)
    m, n = 300, 320
    pairs = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
              torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k ** 0.5) for k in (128, 48, 1000)]
    assert grad_kernels.runs(pairs)
    got = grad_kernels.input_grad(pairs)
    exact = sum(a.float() @ b.float() for a, b in pairs)
    chain = pairs[0][0] @ pairs[0][1]
    for a, b in pairs[1:]:
        chain.addmm_(a, b)
    err, err_cublas = (got.float() - exact).abs().max(), (chain.float() - exact).abs().max()
    assert err <= max(2 * err_cublas, 1e-2), (err, err_cublas)
    assert not grad_kernels.runs([(pairs[0][0].float(), pairs[0][1].float())])  # fp32: cuBLAS's


@pytest.mark.gpu
@requires_cuda
def test_swiglu_in_the_gemm_gives_liger_s_backward_on_gpu():
    """dG and dU from the fused GEMM against Liger's SwiGLU backward of cuBLAS's dH ([700 x 4096] @
    [4096 x 1536], Mistral's hidden size): Liger's arithmetic, so they differ only where dH's bf16
    rounding does (a tie broken the other way by a different summation order)."""
    from liger_kernel.ops.swiglu import swiglu_backward

    from lorabench.fast.kernels import grad as grad_kernels

    torch.manual_seed(0)
    dout = torch.randn(700, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 1536, device="cuda", dtype=torch.bfloat16) / 64
    g, u = (torch.randn(700, 1536, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ref_g, ref_u = swiglu_backward(g.clone(), u.clone(), dout @ w)
    got_g, got_u = grad_kernels.input_grad([(dout, w)], swiglu=(g.clone(), u.clone()))
    for got, ref in ((got_g, ref_g), (got_u, ref_u)):
        assert (got == ref).float().mean() > 0.99
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
@requires_cuda
def test_fast_with_triton_input_grad_and_swiglu_in_gemm_matches_without_on_gpu(monkeypatch):
    """backend=fast (nf4, Liger) with both knobs against without: loss to 1% and LoRA gradients to 3% of
    their norms, with the Triton kernel run where it should."""
    from lorabench.fast.kernels import grad as grad_kernels

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(grad_kernels, "MIN_WAVES", 0)  # the tiny model's 256 tokens: far below 8 waves
    opt = ["backend=fast", "precision=nf4", "optimizer=adamw_torch", "lora.dropout=0"]
    loss_ref, g_ref, _ = lora_grads([*opt, "backend.triton_input_grad=false", "backend.swiglu_in_gemm=false"], cuda)
    calls = spy(monkeypatch, grad_kernels, "input_grad")
    loss, g, _ = lora_grads([*opt, "backend.triton_input_grad=true", "backend.swiglu_in_gemm=true"], cuda)
    # per layer q/k/v's, o's and down's with SwiGLU (the MLP's gate/up stays cuBLAS's), 2 layers, less
    # the first layer's q/k/v: its input (the frozen embeddings, normed) needs no gradient
    assert len(calls) == 3 * 2 - 1
    assert loss == pytest.approx(loss_ref, rel=BF16_LOSS)
    assert_grads_close(g, g_ref, BF16_GRADS)
