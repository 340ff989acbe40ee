"""Which fast part moves a family's LoRA gradients furthest from exact, on a GPU: the tiny model of the family's GPU
test (tests/fast/test_fast_arch.py), hf and fast in bf16 against hf in float64, fast with each of its parts turned
off in turn, and where the family has linear attention, fused_linear turned on again (everywhere, and everywhere but
the linear-attention blocks) and the delta rule compiled (compile_delta_rule). Prints, per variant, the relative
error of the gradients that are furthest from exact, beside hf's own error and how far the float64 answer moves when
every weight moves by one bf16 rounding, and how many gradients leave the family test's bound (2 max(hf, moved) +
2^-8).

    PYTHONPATH=src python docs/runs/scripts/gate_grad_parts.py qwen3_5_text [out.json]
"""
import contextlib
import copy
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "fast")]

import test_fast_arch as t  # noqa: E402  (the family test's own model, config and gradients)

from lorabench.fast import fused, parts  # noqa: E402

PARTS_OFF = ["fused_lora", "fused_mlp", "fused_linear", "fused_add_norm", "triton_input_grad", "swiglu_in_gemm",
             "lean_launch", "upcast_fp32"]


@contextlib.contextmanager
def outside_linear_attention(on: bool):
    """fused_linear everywhere but inside the decoder layers' linear-attention blocks (`linear_attn`), whose
    projections keep PEFT's forward."""
    if not on:
        yield
        return
    real = fused.patch_linears

    def patch(layers, *args, **kwargs):
        n = real(layers, *args, **kwargs)
        for layer in layers:
            for m in (layer.linear_attn.modules() if hasattr(layer, "linear_attn") else ()):
                if hasattr(m, "lorabench_proj"):
                    del m.forward, m.lorabench_proj, m.lorabench_seeded  # the class's forward again: PEFT's
                    n -= 1
        return n

    fused.patch_linears = patch
    try:
        yield
    finally:
        fused.patch_linears = real


def errors(ref: dict, got: dict) -> dict:
    return {n: ((got[n].double() - ref[n]).norm() / ref[n].norm()).item() for n in ref}


def main(model_type: str, out: str | None) -> None:
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")  # (CPU: a dry run)
    base = t.build(model_type, torch.bfloat16, device)
    ids = torch.randint(0, t.VOCAB, (2, t.SEQ), generator=torch.Generator().manual_seed(3)).to(device)
    batch = {"input_ids": ids, "labels": ids}
    common = [f"lora.target_modules={t.targets(model_type)}", "lora.dropout=0", "precision=bf16",
              "train.gradient_checkpointing=true", "train.checkpoint_fraction=0.5"]
    c_hf = t.cfg(*common)
    exact = t.logits_and_grads(copy.deepcopy(base).double(), c_hf, device, batch)[2]
    moved = errors(exact, t.logits_and_grads(copy.deepcopy(base).double(), c_hf, device, batch, jitter=2**-8)[2])
    rows = {"hf": errors(exact, t.logits_and_grads(copy.deepcopy(base), c_hf, device, batch)[2])}
    refused = [o for o in t.REFUSED.get(model_type, ("", []))[1] if o != "backend.fused_linear=false"]
    fast = [*common, "backend=fast", "data.packing=false", "backend.liger=[]", *refused]
    linear = "backend.fused_linear=false" in t.REFUSED.get(model_type, ("", []))[1]  # off for this family
    variants = {"fast": [*fast, f"backend.fused_linear={str(not linear).lower()}"]}
    variants |= {f"fast, {off}=false": [*variants["fast"], f"backend.{off}=false"]
                 for off in PARTS_OFF if not (linear and off == "fused_linear")}
    if linear:
        variants |= {"fast, fused_linear=true": [*fast, "backend.fused_linear=true"],
                     "fast, fused_linear=true but linear_attn": [*fast, "backend.fused_linear=true"],
                     "fast, compile_delta_rule=true": [*variants["fast"], "backend.compile_delta_rule=true"]}
    for name, overrides in variants.items():
        c = t.cfg(*overrides)
        with parts.around_cell(c, base.config), outside_linear_attention(name.endswith("but linear_attn")):
            rows[name] = errors(exact, t.logits_and_grads(copy.deepcopy(base), c, device, batch)[2])
    bound = {n: 2 * max(rows["hf"][n], moved[n]) + 2**-8 for n in exact}
    worst = sorted(exact, key=lambda n: max(r[n] for k, r in rows.items() if k != "hf") / bound[n])[-4:]
    print("gradient (the 4 where a fast variant is furthest beyond max(hf, moved)): "
          + "; ".join(w.split("model.")[-1] for w in worst))
    print(f"{'bound 2 max(hf, moved) + 2^-8':<42}" + "".join(f"{bound[n]:>9.2%}" for n in worst))
    print(f"{'moved by one rounding':<42}" + "".join(f"{moved[n]:>9.2%}" for n in worst))
    for name, e in rows.items():
        out_of, top = sum(e[n] > bound[n] for n in exact), max(e[n] / bound[n] for n in exact)
        print(f"{name:<42}" + "".join(f"{e[n]:>9.2%}" for n in worst)
              + f"   {out_of} of {len(exact)} beyond the bound, the worst at {top:.2f} of it")
    if out:
        Path(out).write_text(json.dumps({"moved": moved, **rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
