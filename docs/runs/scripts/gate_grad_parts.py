"""Which fast part moves a family's LoRA gradients furthest from exact, on a GPU: the tiny model of the family's GPU
test (tests/fast/test_fast_arch.py), hf and fast in bf16 against hf in float64, fast with each of its parts turned
off in turn. Prints, per variant, the relative error of the gradients that are furthest from exact, beside hf's own
error and how far the float64 answer moves when every weight moves by one bf16 rounding.

    PYTHONPATH=src python docs/runs/scripts/gate_grad_parts.py qwen3_5_text [out.json]
"""
import copy
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "fast")]

import test_fast_arch as t  # noqa: E402  (the family test's own model, config and gradients)

from lorabench.fast import parts  # noqa: E402

PARTS_OFF = ["fused_lora", "fused_mlp", "fused_linear", "fused_add_norm", "triton_input_grad", "swiglu_in_gemm",
             "lean_launch", "upcast_fp32"]


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
    fast = [*common, "backend=fast", "data.packing=false", "backend.liger=[]",
            *t.REFUSED.get(model_type, ("", []))[1]]
    for off in [None, *PARTS_OFF]:
        c = t.cfg(*fast, *([f"backend.{off}=false"] if off else []))
        with parts.around_cell(c, base.config):
            rows[f"fast, {off}=false" if off else "fast"] = errors(
                exact, t.logits_and_grads(copy.deepcopy(base), c, device, batch)[2])
    worst = sorted(exact, key=lambda n: rows["fast"][n] / max(rows["hf"][n], moved[n]))[-4:]
    print("gradient (the 4 where fast is furthest beyond max(hf, moved)): " + "; ".join(w.split("model.")[-1]
                                                                                       for w in worst))
    print(f"{'moved by one rounding':<34}" + "".join(f"{moved[n]:>9.2%}" for n in worst))
    for name, e in rows.items():
        print(f"{name:<34}" + "".join(f"{e[n]:>9.2%}" for n in worst))
    if out:
        Path(out).write_text(json.dumps({"moved": moved, **rows}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
