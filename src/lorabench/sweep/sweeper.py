"""The Hydra sweeper of +experiment=tune and +experiment=max_context (its plugin: hydra_plugins.lorabench_search):
the outer grid from the command line, and per outer cell a search of layout x batch (lorabench.sweep.search) or
of the longest context (lorabench.sweep.context), each cell through the configured launcher."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from hydra.plugins.sweeper import Sweeper

from lorabench.core.results import (
    CELLS_FILE,
    OOM_AT_BUILD,
    RESULT_FILE,
    SearchRecord,
    atomic_write_json,
    read_cells,
    read_result,
    write_searches,
)
from lorabench.sweep.grid import expand
from lorabench.sweep.search import (
    Measure,
    Measured,
    dropout_zero,
    outer_cells,
    override_key,
    search,
    search_keys,
    space_for,
)


def at_load(r) -> bool:
    """An out-of-memory cell whose model's build ran out (its weights, adapters and upcasts), before any step: its
    error says so (OOM_AT_BUILD, after a DDP rank's "rank 0 of 1: " where it ran in a process of its own)."""
    return r.status.value == "oom" and OOM_AT_BUILD in (r.error or "")


def earlier_oom(run_dir: Path, overrides: list[str]) -> Measured | None:
    """A cell this search ran out of memory in an earlier run of the same command (its dir holds the same
    overrides and an oom result): read back, not run again, as a cell that ended ok is by the cell itself
    (lorabench.run.cell), unless train.force=true. A max-context search resumed runs none of its OOM probes
    again (each one a model load)."""
    import yaml

    if "train.force=true" in overrides:
        return None
    try:
        r = read_result(run_dir / RESULT_FILE)
        same = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == list(overrides)
    except (OSError, ValueError, TypeError, yaml.YAMLError):
        return None
    if r.status.value != "oom" or not same:
        return None
    print(f"cell {r.job_num}: out of memory in an earlier run of this search ({run_dir / RESULT_FILE}): "
          "not run again", file=sys.stderr)
    m = r.metrics
    return Measured("oom", None, m.get("mem/peak_reserved_gib"), r.job_num, r.error, m.get("mem/device_total_gib"),
                    at_load=at_load(r))


class BudgetSearch(Sweeper):
    """hydra.sweeper of +experiment=tune (its Hydra plugin: hydra_plugins.lorabench_search): the outer
    grid from the command line, a `search` per outer cell, each cell through the configured launcher."""

    def __init__(self, max_batch_size: Optional[int] = None, params: Optional[dict] = None):
        self.params = dict(params or {})
        self.job = 0
        self.returns: list = []
        self.stop: SystemExit | None = None  # a cell ended the sweep: recorded, then the process exits with its code

    def setup(self, *, hydra_context, task_function, config) -> None:
        from hydra.core.plugins import Plugins

        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list:
        from omegaconf import OmegaConf

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        cells = expand(arguments, OmegaConf.create(self.params), self.hydra_context.config_loader)
        keys = search_keys(self.config)
        if dropped := sorted({override_key(o) for cell in cells for o in cell if override_key(o) in keys}):
            print(f"search: {', '.join(dropped)} set by the search in every cell; the command line's value is not "
                  "used (the candidates are search.batches, search.checkpoint_fractions, search.offload_fractions; "
                  "a max-context search's seq_len: search.min_seq_len to search.max_seq_len)", file=sys.stderr)
        outer = outer_cells(cells, keys)
        records: list[SearchRecord] = []
        for cell in outer:
            records.append(self.search_one(cell, outer, sweep_dir))
            write_searches(sweep_dir, records)
            if self.stop is not None:  # SIGTERM, Ctrl-C or sweep.deadline_s: the same command resumes (see above)
                self.rewrite_report(sweep_dir)
                raise self.stop
        return self.returns

    def rewrite_report(self, sweep_dir: Path) -> None:
        """The report again, now that search.json holds the search the stop cut short (the cell's stop wrote
        it before the search had recorded its last cell): the plugin's class (hydra_plugins.lorabench_search,
        above lorabench.report.page, which reads search.json through this module) does it."""

    def compose(self, overrides: list[str]):
        from omegaconf import OmegaConf, open_dict

        cfg = self.hydra_context.config_loader.load_sweep_config(master_config=self.config,
                                                                 sweep_overrides=list(overrides))
        with open_dict(cfg):
            del cfg["hydra"]
        return OmegaConf.to_object(cfg)

    def search_one(self, cell: list[str], outer: list[list[str]], sweep_dir: Path) -> SearchRecord:
        """One outer cell's search, printing a line per cell ("[backend=fast 5/12] b24 ckpt 0.5 offload
        0.25: 15,291 tok/s"); with search.target=max_context its longest context (lorabench.sweep.context)."""
        from lorabench.core.config import SearchTarget
        from lorabench.core.devices import visible_gpu_gib
        from lorabench.core.results import cell_name

        c = self.compose(cell)
        # gpu=auto with cells run in this process's node (Hydra's basic launcher): the device's size up front
        here = type(self.launcher).__name__ == "BasicLauncher" and c.gpu.name == "auto" \
            and c.train.device.value != "cpu"
        device_gib = visible_gpu_gib() if here else None
        name = cell_name(cell, outer) if len(outer) > 1 else "search"
        log = lambda s: print(f"[{name}] {s}", file=sys.stderr, flush=True)  # noqa: E731
        counter = iter(range(1, 10**6))

        def launched(overrides: list[str], what_cell: str) -> Measured:
            n = next(counter)  # the cell that spends the cap of the command's last outer cell: the sweep's last
            m = self.launch(overrides, sweep_dir, last=n >= c.search.max_cells and cell == outer[-1])
            what = f"{m.tok_s:,.0f} tok/s" if m.status == "ok" else m.status
            what += f" ({m.error[:120]})" if m.error and m.status != "ok" else ""
            peak = f", peak {m.peak_gib:.1f} GiB" if m.peak_gib is not None else ""
            print(f"[{name} {n}/{c.search.max_cells}] {what_cell}: {what}{peak}", file=sys.stderr, flush=True)
            return m

        if c.search.target is SearchTarget.max_context:
            return self.context_one(c, cell, name, device_gib, launched, log)
        space = space_for(c, device_gib)

        def measure(extra: tuple[str, ...] = ()) -> Measure:
            return lambda L, b: launched(cell + list(L.overrides) + [f"batch={b}", *extra],
                                         f"b{b} {L.label}{' '.join(('',) + extra)}")

        log(f"{len(space.layouts)} layouts x {len(space.batches)} batches, at most {space.max_cells} cells, budget "
            + (f"{space.budget_gib:g} GiB" if space.budget_gib else "the device's memory")
            + f" (estimated fixed part {space.fixed_gib:.1f} GiB)")
        out = search(space, measure(), log)
        zero = []
        if c.search.allow_dropout_zero and c.lora.dropout > 0 and out.best and not out.cut_short:
            zero = dropout_zero(space, out.best, measure(("lora.dropout=0",)), c.search.max_cells - space.max_cells,
                                log)
        log(f"best: {out.best.name() if out.best else 'none'}: {out.why}")
        return SearchRecord(name, cell, c.backend.name.value, out.budget_gib, c.seq_len, c.search.max_cells,
                            out.trials, out.best, out.why, out.stops, zero, out.cut_short)

    def context_one(self, c, cell: list[str], name: str, device_gib: float | None, launched, log) -> SearchRecord:
        """One outer cell's longest context: seq_len bisected at batch 1 in its backend's most memory-saving
        layout (lorabench.sweep.context), each probe a cell of the sweep."""
        from lorabench.sweep.context import context_space, max_context

        space = context_space(c, device_gib)
        log(f"longest context of {space.layout.label}: seq_len in [{space.min_seq:,}, {space.max_seq:,}] at batch 1, "
            f"at most {space.max_cells} cells, budget "
            + (f"{space.budget_gib:g} GiB" if space.budget_gib else "the device's memory")
            + f" (estimated fixed part {space.fixed_gib:.1f} GiB)")
        out = max_context(space, lambda L, seq: launched(cell + list(L.overrides) + [f"seq_len={seq}", "batch=1"],
                                                         f"seq {seq:,} {L.label}"), log)
        ceil = out.ceiling
        best = next((t for t in out.trials if ceil.job is not None and t.job == ceil.job), None)
        why = (f"longest that fits {ceil.longest_ok:,} tokens; " if ceil.longest_ok else "") + ceil.stop + \
            (f"; cut short: {out.cut_short}" if out.cut_short and out.cut_short != ceil.stop else "")
        log(f"ceiling: {why}")
        return SearchRecord(name, cell, c.backend.name.value, out.budget_gib, ceil.longest_ok or 0,
                            c.search.max_cells, out.trials, best, why, {}, [], out.cut_short, "max_context", ceil)

    def launch(self, overrides: list[str], sweep_dir: Path, last: bool = False) -> Measured:
        """One cell through the launcher; its result read back from its metrics.json. `last`: no cell follows it
        (sweep.deadline_s then has none to keep from starting, lorabench.sweep.callbacks.EndSweep)."""
        from omegaconf import OmegaConf

        self.validate_batch_is_legal([overrides])
        job, self.job = self.job, self.job + 1
        # cells.json names the cells: each one by the overrides that differ between them (results.cell_name)
        known = read_cells(sweep_dir)  # (a re-run of the same command proposes the same cells: resumed, not repeated)
        atomic_write_json(sweep_dir / CELLS_FILE, {"cells": known + ([overrides] if overrides not in known else [])}
                          | ({"last_job": job} if last else {}))
        if (earlier := earlier_oom(sweep_dir / str(job), overrides)) is not None:
            return earlier
        last = ""
        try:
            ret = self.launcher.launch([overrides], initial_job_idx=job)[0]
            self.returns.append(ret)
        except SystemExit as stop:  # the cell ended the sweep (lorabench.run.cell.end_sweep): its result still counts
            from lorabench.run.preemption import HANDLER

            self.stop, ret = stop, None
            last = HANDLER.signal_name if HANDLER.requested else "sweep.deadline_s"
        # the cell's output dir (working_dir is the process's cwd unless hydra.job.chdir)
        out = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret and ret.hydra_cfg is not None else None
        run_dir = Path(out) if out else sweep_dir / str(job)
        try:
            r = read_result(run_dir / RESULT_FILE)
        except (OSError, ValueError, TypeError) as e:
            return Measured("failed", job=job, error=f"no result in {run_dir}: {e}", last=last)
        from lorabench.report.analysis import p50_tokens_per_s

        m = r.metrics
        tok = m.get("perf/tokens_per_s") if r.ok else None
        return Measured(r.status.value, tok, m.get("mem/peak_reserved_gib"), job, r.error,
                        m.get("mem/device_total_gib"), last, p50_tokens_per_s(m) if tok else None, at_load(r))
