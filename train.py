"""Train one LoRA/QLoRA cell, or a grid of them with -m, and record what it cost.

    python train.py                                  # tiny Mistral, CPU, ~10 s
    python train.py -m seq_len=512,1024 batch=4,8    # 4 cells
    python train.py +experiment=seed_baseline        # Mistral-7B nf4 on a GPU
    python train.py --help                           # examples, option lists, exit codes

The work lives in src/lorabench/train.py; conf/train.yaml lists every knob. A single run exits 0
only when its cell ends ok (README: "Exit codes"); a multirun's exit code comes from lorabench.sweep.callbacks.
"""

import os
import sys

# Nothing reaches a model or dataset hub, or W&B, unless asked (set HF_HUB_OFFLINE=0 to download).
for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(var, "1")

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

import lorabench.core.config  # noqa: E402,F401  (registers the schemas in Hydra's ConfigStore)
from lorabench.core.results import RunContext  # noqa: E402


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig):
    from lorabench.train import run_cell

    ctx = RunContext.from_hydra(HydraConfig.get())
    result = run_cell(cfg, ctx)
    if not ctx.multirun and not result.ok:
        sys.exit(result.exit_code)
    return result.metrics.get("perf/tokens_per_s")  # for sweepers that optimise


if __name__ == "__main__":
    if error := lorabench.core.config.renamed_key(sys.argv[1:]):
        sys.exit(f"train.py: {error}")
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside a cell (in a cell, lorabench.run.preemption handles it)
        print("train.py: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(4)
