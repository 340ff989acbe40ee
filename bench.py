"""Benchmarks beside training, through the same model builders (src/lorabench/bench.py).

    python bench.py suite=hardware                               # matmul, memory and host-link bandwidth
    python bench.py -m suite=loading model=mistral-7b-v0.3 precision=bf16,nf4,int8
    python bench.py -m suite=inference model=mistral-7b-v0.3 precision=bf16,nf4
    python bench.py suite=consistency 'consistency.inputs=[outputs/node*/metrics.json]'
    python bench.py sweep_dir=outputs/sweeps/<time>             # the sweep report (also a partial sweep)
    python bench.py --help                                       # suites, examples, options, exit codes
"""

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import lorabench.core.config  # noqa: F401  (registers the schemas in Hydra's ConfigStore)
from lorabench.core.results import EXIT_CODES, RunContext, Status


@hydra.main(version_base="1.3", config_path="conf", config_name="bench")
def main(cfg: DictConfig) -> None:
    from lorabench.bench import run_suite

    ctx = RunContext.from_hydra(HydraConfig.get())
    try:
        code = run_suite(cfg, ctx)
    except (OSError, ValueError) as e:  # a wrong dir or value: one line, no traceback, exit 2 as train.py's bad values
        print(f"bench.py: {e}", file=sys.stderr)
        sys.exit(EXIT_CODES[Status.failed])
    if code and not ctx.multirun:
        sys.exit(code)  # a failed cell or an exceeded tolerance; a multirun goes on to its next cell


if __name__ == "__main__":
    if error := lorabench.core.config.renamed_key(sys.argv[1:]):
        sys.exit(f"bench.py: {error}")
    try:
        main()
    except KeyboardInterrupt:  # Ctrl-C outside a cell (in a cell, lorabench.run.preemption handles it)
        print("bench.py: interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(4)
