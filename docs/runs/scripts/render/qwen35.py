"""Qwen3.5-9B within 22 GiB on one H100: fast with flash-linear-attention's kernels for its linear-attention layers
against hf with transformers' PyTorch rule, and the GPU tests of the 2026 families in the same run."""
import re

from .recipes import GRADIENT, gradient
from .runs import RUNS, bests, command, commit, gpu, link, software
from .searched import searched_table

RUN = "2026-12-07_h100_qwen35"  # one list on one GPU: the GPU tests, then fast's and hf's two cells each
FLA = "2026-12-07b_h100_fla"  # fla against the PyTorch rule on the same GPU model, a later call


def gpu_tests() -> str:
    """The run's GPU tests from pytest's own summary: how many passed of how many, and each failure's test and the
    assertion it stopped at (for a gradient: fast's and hf's error from float64 and the bound)."""
    text = (RUNS / RUN / "gpu_tests.txt").read_text()
    failed, passed = (int(n) for n in re.findall(r"^(\d+) failed, (\d+) passed", text, re.M)[-1])
    names = re.findall(r"^FAILED \S+::(\w+(?:\[\w+\])?)", text, re.M)
    grads = GRADIENT.findall(text)
    failures = []
    for name in names:
        failures.append(f"`{name}`")
        if "[" in name and grads:  # a family's test: the gradient it stopped at
            failures[-1] += f" (the gradient of {gradient(*grads.pop(0))})"
    return f"{passed} of {passed + failed} passed; failed: " + "; ".join(failures)


def fla_exactness() -> str:
    """fla's GPU exactness test as pytest summed it up: passed or failed, on which GPU."""
    text = (RUNS / FLA / "fla_test.txt").read_text()
    summary = re.findall(r"^=+ (.*(?:passed|failed).*) =+$", text, re.M)[-1]
    counts, seconds = re.search(r"^(.*?(?:passed|failed))\b.* in ([\d.]+)s", summary).groups()
    ok = counts == "1 passed"
    gpu_name = (RUNS / FLA / "gpu_c1.csv").read_text().splitlines()[1].split(",")[1].strip()
    return (f"fla's own exactness test (`test_fla_computes_qwen3_5_s_model_on_gpu`: fast with fla's kernels and hf with "
            f"the PyTorch rule, both in bf16, against hf in float64) {'passed' if ok else 'did not pass'} on an "
            f"{gpu_name} in a later call ({counts} in {float(seconds):.0f} s; {link(FLA + '/fla_test.txt')})")


def qwen35() -> str:
    one = bests(f"{RUN}/qwen3.5-9b_fast")["fast"].cell
    label = "Qwen3.5-9B, LoRA r16 on q/k/v/o of its 8 full-attention layers"
    return "\n\n".join([
        "## Qwen3.5's linear attention through flash-linear-attention",
        f"One {gpu(one)}, within 22 GiB (`gpu=a10`), seq 1024, nf4 QLoRA, synthetic rows; two cells a backend "
        "(batches 8 and 16 for fast, 2 and 4 for hf, the layouts each search put first). fast ran Qwen3.5's 24 Gated "
        "DeltaNet layers through flash-linear-attention 0.6.0 (`backend.fla_on_hopper`: fla refuses Hopper GPUs under "
        "Triton 3.6 for a 64-wide key tile that Qwen3.5's 128-wide key heads do not take); hf ran them through "
        "transformers' PyTorch rule, fla being refused there. In this run fla's test was stopped by its time limit; "
        + fla_exactness() + ". fast without fla is the row \"fast without flash-linear-attention\" of the section "
        "above.",
        searched_table(RUN, ((label, "qwen3.5-9b"),),
                       {"unsloth": "not measured: the list's time limit came before its cells finished"}),
        "```bash\n" + "\n".join(command(f"{RUN}/qwen3.5-9b_{b}") for b in ("fast", "hf")) + "\n```",
        "The GPU tests in the same run, fla set aside (`pytest -m gpu tests/fast/test_fast_arch.py "
        "tests/models/test_experts_nf4.py -k \"2026_families or flex or experts\"`: each 2026 family's tiny model, "
        "fast and hf in bf16 against hf in float64; Gemma-2's flex attention; gpt-oss's experts in nf4): "
        + gpu_tests() + f" ({link(RUN + '/gpu_tests.txt')}). gpt-oss's attention is eager in fast since; the "
        "experts' size was exactly the test's bound, 0.5 + 1/64 bytes a weight, which the test states since.",
        f"Run dir: {link(RUN)} (commit {commit(one)}; {software(one)}); how it ran: {link(RUN + '/README.md')}."])
