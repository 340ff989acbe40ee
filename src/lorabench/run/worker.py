"""One rank of a cell that lorabench.run.distributed launched (`python -m lorabench.run.worker <run dir>`,
under torchrun, or alone for backend=unsloth): the cell from its resolved config, through the same
lorabench.run.loop.measure as a cell in the Hydra process; rank<r>.json whatever happens, its status
from the same wrapper as a cell's (lorabench.run.cell.record): an exception gives the same status here.

The launcher names this module only as a command; it imports nothing of the training code. Unsloth
must be imported before transformers, so the training code is imported inside `worker`.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from lorabench.core.config import Backend, Config
from lorabench.core.results import CONFIG_FILE, CellResult, Status, write_result
from lorabench.measure.loggers import NullLogger
from lorabench.measure.metrics import memory_stats
from lorabench.run import tether
from lorabench.run.cell import record

log = logging.getLogger(__name__)


def unsloth_environment(c: Config) -> dict[str, str]:
    """The environment that sets what the cell's config says of Unsloth's parts (its own switches)."""
    return {} if c.backend.unsloth_fused_lora else {"UNSLOTH_FUSED_LORA_DROPOUT": "0"}


def worker(run_dir: Path) -> None:
    """One rank of a cell started by lorabench.run.distributed (under torchrun, or alone for
    backend=unsloth): the cell from its resolved config; rank<r>.json whatever happens."""
    rank = int(os.environ["RANK"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[rank {rank}] %(asctime)s %(name)s %(levelname)s %(message)s")
    c = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(run_dir / CONFIG_FILE)))
    result = CellResult(status=Status.running, cell=f"rank {rank}")

    def measure() -> dict:
        if c.backend.name is Backend.unsloth:
            # Unsloth writes the code it compiles to ./unsloth_compiled_cache unless told where.
            os.environ.setdefault("UNSLOTH_COMPILE_LOCATION",
                                  os.path.join(os.path.expanduser(c.data.cache_dir), "unsloth_compiled_cache"))
            os.environ.update(unsloth_environment(c))  # read by Unsloth's modules as they are imported
            import unsloth  # noqa: F401  (before transformers, as Unsloth asks: it patches it on import)
        from lorabench.run.loop import measure  # (after unsloth: it imports transformers)

        return measure(c, run_dir, result, NullLogger(), rank=rank)

    try:
        record(result, run_dir / f"error.rank{rank}.txt", measure)
    finally:
        if result.status is Status.running:  # SystemExit passing through
            result.status, result.error = Status.interrupted, "interrupted"
        if result.device and result.device.startswith("cuda"):
            result.metrics = {**memory_stats(torch.device(result.device)), **result.metrics}
        write_result(run_dir / f"rank{rank}.json", result)
    if not result.ok:
        sys.exit(1)


if __name__ == "__main__":
    if tether.PARENT_ENV in os.environ:  # no orphan rank training on after torchrun (or the launcher) died
        tether.die_with_parent(int(os.environ[tether.PARENT_ENV]))
    worker(Path(sys.argv[1]))
