"""Minimal torch-only form of the failure: a no_grad view of a requires-grad tensor, made a leaf with
requires_grad_(True) (TiledMLP.backward), fed to a Function whose backward writes dX into its saved input
(unsloth LoRA_MLP.backward: torch.matmul(..., out = X)). AccumulateGrad calls grad_fn() on the leaf view,
sees its version bumped and raises."""
import torch
class WritesInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X): ctx.save_for_backward(X); return X * 2
    @staticmethod
    def backward(ctx, dY):
        X, = ctx.saved_tensors
        return torch.mul(dY, 2, out=X) if WritesInput.inplace else dY * 2
for base_requires_grad in (True, False):
    for inplace in (True, False):
        for preset_grad in (True, False):
            x = torch.randn(4, 8, requires_grad=base_requires_grad)
            with torch.no_grad():          # TiledMLP.backward runs with grad mode off
                v = x.view(-1, 8).split(2)[0].unsqueeze(0)
                v.requires_grad_(True)
                if preset_grad: v.grad = torch.zeros_like(v)
            WritesInput.inplace = inplace
            try:
                with torch.enable_grad(): y = WritesInput.apply(v)
                torch.autograd.backward(y, torch.ones_like(y)); r = "ok"
            except RuntimeError as e: r = "RuntimeError: " + str(e)[:95]
            print(f"base requires_grad={base_requires_grad!s:<5} backward writes into X={inplace!s:<5} .grad preset={preset_grad!s:<5} -> {r}")
