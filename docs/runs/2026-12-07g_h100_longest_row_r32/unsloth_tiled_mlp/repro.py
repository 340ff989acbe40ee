"""CPU repro: unsloth_zoo 2026.10.9's TiledMLP + unsloth 2026.10.9's fused LoRA_MLP (their own source, exec'd
from the wheels with only the Triton/bnb helpers stubbed by torch equivalents), a PEFT-LoRA'd Llama MLP
(r=4, dropout 0.05 / 0.0 on gate/up/down), inside an Unsloth-style recompute-in-backward checkpoint."""
import ast, itertools, sys, traceback, types
import torch, torch.nn as nn, torch.nn.functional as F
from peft import LoraConfig, get_peft_model

SRC = sys.argv[1] if len(sys.argv) > 1 else "/tmp/tiledmlp/src"  # the two wheels unzipped: unsloth_zoo/, unsloth/
torch.manual_seed(0)


def source_of(path, names):  # top-level defs/classes of a file, verbatim
    text = open(path).read()
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            out.append("".join(lines[start:node.end_lineno]))
    return "\n".join(out)


# ---- unsloth_zoo.tiled_mlp.TiledMLP, verbatim
from torch.utils.checkpoint import _infer_device_type, _get_device_module, get_device_states, set_device_states
zoo = dict(torch=torch, _infer_device_type=_infer_device_type, _get_device_module=_get_device_module,
           get_device_states=get_device_states, set_device_states=set_device_states, FIRST_PASS=False,
           UNSLOTH_ENABLE_LOGGING=False, UNSLOTH_ENABLE_TILED_LOGGING=False,
           torch_amp_custom_fwd=torch.amp.custom_fwd(device_type="cpu"),
           torch_amp_custom_bwd=torch.amp.custom_bwd(device_type="cpu"))
exec(source_of(f"{SRC}/unsloth_zoo/tiled_mlp.py", {"TiledMLP"}), zoo)
TiledMLP = zoo["TiledMLP"]

# ---- unsloth.kernels.fast_lora.LoRA_MLP and its helpers, verbatim; Triton / bnb pieces -> torch
def matmul_lora(X, W, W_quant, A, B, s, out=None, use_global_buffer=True):
    shape = X.shape
    X = X.view(-1, shape[-1])
    out = torch.matmul(X, W.t(), out=out)
    if A is not None:
        out.addmm_(X @ A.t().to(X.dtype), B.t().to(X.dtype), alpha=s)
    return out.view(*shape[:-1], -1)

def swiglu_fg_kernel(e, g):
    return (F.silu(e.float()).to(e.dtype)) * g

def swiglu_DWf_DW_dfg_kernel(DW, e, g):  # unsloth.kernels.swiglu._DWf_DW_dfg_traced, verbatim math
    e_float = e.float(); se = torch.sigmoid(e_float); f = (se * e_float).to(DW.dtype)
    return f * g, DW * f, (DW * g).float().mul(se * (1.0 + e_float * (1.0 - se))).to(DW.dtype)

lora = dict(torch=torch, matmul_lora=matmul_lora, fast_dequantize=lambda W, q, dtype=None, **k: W,
            addmm_=lambda out, A, B, alpha=1.0, beta=1.0: out.addmm_(A, B, alpha=alpha, beta=beta),
            torch_amp_custom_fwd=torch.amp.custom_fwd(device_type="cpu"),
            torch_amp_custom_bwd=torch.amp.custom_bwd(device_type="cpu"),
            _rms_layernorm=types.SimpleNamespace(_SAVE_OUTPUT=False),  # UNSLOTH_RMSNORM_SAVE_OUTPUT default "0"
            _is_compiling=torch.compiler.is_compiling)
exec(source_of(f"{SRC}/unsloth/kernels/fast_lora.py",
               {"_dropout_forward", "_dropout_replay", "_matmul_lora_ext", "_add_lora_dX", "_lora_bias_grad",
                "_may_overwrite_input", "LoRA_MLP"}), lora)
LoRA_MLP = lora["LoRA_MLP"]


def lora_params(proj):  # unsloth.kernels.utils.get_lora_parameters for an unquantised base
    return proj.base_layer.weight, None, proj.lora_A["default"].weight, proj.lora_B["default"].weight, proj.scaling["default"]


def fused_forward(inplace):  # apply_lora_mlp_swiglu's call (dropout_p tuple when a dropout module exists)
    def f(self, X):
        p = self.gate_proj.lora_dropout["default"]
        dropout_p = (p.p,) * 3 if isinstance(p, nn.Dropout) and self.training else None
        return LoRA_MLP.apply(X, *lora_params(self.gate_proj), *lora_params(self.up_proj),
                              *lora_params(self.down_proj), swiglu_fg_kernel, swiglu_DWf_DW_dfg_kernel,
                              inplace, dropout_p, None, None, None)
    return f


class MLP(nn.Module):  # LlamaMLP
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False), nn.Linear(i, h, bias=False)
        self.act_fn = nn.SiLU()
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class UnslothRMSNorm(torch.autograd.Function):  # shape of unsloth's Fast_RMS_Layernorm: returns Y.view(*shape)
    @staticmethod
    def forward(ctx, X, W, eps):
        shape = X.shape
        X = X.reshape(-1, shape[-1]).contiguous()
        r = torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps)
        Y = X * r * W
        ctx.save_for_backward(X, W, r)
        return Y.view(*shape)
    @staticmethod
    def backward(ctx, dY):
        X, W, r = ctx.saved_tensors
        with torch.enable_grad():
            x = X.detach().requires_grad_()
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * W
            dX, = torch.autograd.grad(y, x, dY.reshape(y.shape))
        return dX.view(dY.shape), None, None


def hf_rmsnorm(x, w):  # transformers' LlamaRMSNorm: a fresh (non-view) output
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class Checkpoint(torch.autograd.Function):  # unsloth_zoo Unsloth_Offloaded_Gradient_Checkpointer, essentials
    @staticmethod
    def forward(ctx, fn, x):
        ctx.fn, ctx.rng = fn, torch.get_rng_state()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return fn(x)
    @staticmethod
    def backward(ctx, dY):
        x, = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.rng)
            x = x.detach(); x.requires_grad = True
            with torch.enable_grad():
                out = ctx.fn(x)
        torch.autograd.backward(out, dY)  # gradient_checkpointing.py:1698
        return None, x.grad


def build(dropout, mlp_mode, tiled, H=32, I=64):
    torch.manual_seed(0)
    m = get_peft_model(nn.ModuleDict({"mlp": MLP(H, I)}),
                       LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["gate_proj", "up_proj", "down_proj"]))
    for n, p in m.named_parameters():
        if "lora_B" in n: nn.init.normal_(p, std=0.1)
    mlp = m.base_model.model["mlp"]
    inner = types.MethodType(type(mlp).forward if mlp_mode == "peft" else fused_forward(mlp_mode == "fused_inplace"), mlp)
    if tiled:  # unsloth_zoo patch_mlp / tiled_forward_arctic_size, chunk = H rows
        fwd = lambda x: TiledMLP.apply(inner, mlp, x, True, max(1, x.shape[0] * x.shape[1] // H), H)
    else:
        fwd = inner
    return m, mlp, fwd


def run(dropout, mlp_mode, tiled, norm, ckpt, S=128, H=32):
    m, mlp, fwd = build(dropout, mlp_mode, tiled, H)
    w = torch.ones(H)
    def layer(h):  # Unsloth's decoder layer, MLP half: residual + mlp(post_attention_layernorm(h))
        n = UnslothRMSNorm.apply(h, w, 1e-6) if norm == "unsloth_fn" else hf_rmsnorm(h, w)
        return h + fwd(n)
    if norm == "unsloth_fn_compiled":
        layer_c = torch.compile(lambda n: n * 1.0, backend="aot_eager")  # stand-in: a compiled producer
        def layer(h):
            n = layer_c(UnslothRMSNorm.apply(h, w, 1e-6))
            return h + fwd(n)
    torch.manual_seed(1)
    emb = torch.randn(1, S, H, requires_grad=True)
    out = Checkpoint.apply(layer, emb) if ckpt else layer(emb)
    out.pow(2).mean().backward()
    grads = [emb.grad] + [p.grad for n, p in m.named_parameters() if "lora_" in n]
    return grads


if __name__ == "__main__":
    print("torch", torch.__version__)
    ref = {}
    for dropout, mlp_mode, norm, ckpt in itertools.product(
            (0.05, 0.0), ("peft", "fused_inplace", "fused_noinplace"), ("hf", "unsloth_fn", "unsloth_fn_compiled"), (True, False)):
        for tiled in (False, True):
            tag = f"dropout={dropout:<4} mlp={mlp_mode:<15} norm={norm:<19} ckpt={ckpt!s:<5} tiled={tiled!s:<5}"
            try:
                g = run(dropout, mlp_mode, tiled, norm, ckpt)
                key = (dropout, mlp_mode, norm, ckpt)
                if not tiled:
                    ref[key] = g; res = "ok"
                else:
                    err = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(g, ref[key]))
                    res = f"ok   max rel grad diff vs untiled {err:.1e}" + ("" if dropout == 0 else " (dropout masks differ per tile)")
            except RuntimeError as e:
                res = "RuntimeError: " + str(e).split(". Given")[0][:110]
            print(tag, res)
