"""A multirun from start to end, as Hydra callbacks (conf/train.yaml, hydra.callbacks):

  Preflight     before the first cell: the sweep dir locked for this multirun (lorabench.run.rundir), every
                cell composed and its values checked (the checks a cell runs first,
                lorabench.run.checks.check_values: every problem of every cell is listed), and each cell's
                dir checked for a run of another config (sweep.overwrite=true moves an earlier sweep
                aside). By default a sweep with an invalid cell stops within seconds naming each one;
                with sweep.keep_going=true the valid cells run and the invalid ones fail at their own
                checks. An unknown option, key or type exits 1, as Hydra's own errors; the rest 2. It
                writes cells.json (every cell's overrides) in the sweep dir: cells name themselves and
                count progress from it.
                With a tracker that nests cells under a run of the sweep (logger=mlflow), that run is made here.
  SweepSummary  after the last cell: the report, the sweep's group in each tracker (W&B's aggregate run,
                MLflow's parent run, TensorBoard's sweep dir; one line each), a last line counting cells per
                status, and the exit code (0 when every cell is ok, oom or skipped).

A run that is not a multirun gets the output-dir checks only: writable with room, its lock, its binding
(before Hydra writes .hydra/ there).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean
from typing import NoReturn

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from lorabench.core.config import BenchConfig, Config, LoggerConfig, ReportConfig
from lorabench.core.results import (
    CELLS_FILE,
    EXIT_CODES,
    MEASURED,
    SEARCH_SWEEPER,
    CellResult,
    RunContext,
    Status,
    atomic_write_json,
    load_results,
    read_cells,
    search_last_job,
)
from lorabench.run import rundir
from lorabench.run.checks import bench_problems, value_problems
from lorabench.run.preemption import HANDLER as preemption
from lorabench.sweep.grid import expand

log = logging.getLogger(__name__)

EXIT_INVALID = EXIT_CODES[Status.failed]
EXIT_USAGE = 1  # an unknown option, key or type: Hydra's own exit code for a bad command line
PROBE_BYTES = 16 * 1024  # .hydra's config.yaml, hydra.yaml and overrides.yaml: ~6 KB for train.py (2.3 + 3.4 + 0.1)


def one_line(e: BaseException) -> str:
    """An error as one line: its first line, and its cause's (Hydra's composition errors)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cause = e.__cause__ and str(e.__cause__).strip().splitlines()
    return text + (f" ({cause[0]})" if cause and cause[0] not in text else "")


def check_writable(path: Path, key: str) -> None:
    """Stop with one line when the output dir cannot be made or written, or has less room than what
    Hydra writes there before the cell starts (Hydra would print a traceback)."""
    probe = path / f".lorabench-write-test.{os.getpid()}"  # one per process: a run's nodes share their dir
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0")
        probe.unlink()
        if shutil.disk_usage(path).free < PROBE_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as e:
        with contextlib.suppress(OSError):  # (on a read-only file system even removing no file fails)
            probe.unlink(missing_ok=True)
        print(f"{key}={path}: {rundir.cannot_write(path, e)}", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def enter_dir(path: Path, config: dict | None, key: str, keep: tuple[str, ...]) -> None:
    """Hold the run or sweep dir's lock for this process's life and check its binding; one line and
    exit code 2 when another run holds it or it holds a run of another config (lorabench.run.rundir)."""
    try:
        rundir.lock(path)
        if config is not None:
            overwrite = OmegaConf.select(OmegaConf.create(config), "sweep.overwrite", default=False)
            rundir.check_binding(path, config, overwrite, key, keep)
    except (rundir.RunDirError, OSError) as e:
        print(rundir.describe(e, path), file=sys.stderr)
        sys.exit(EXIT_INVALID)


def task_config(config: DictConfig) -> dict | None:
    """The resolved config a cell gets (Hydra's node removed), as cell.run records it; None when it
    does not resolve without Hydra's node (the cell's own check then runs at its start)."""
    try:
        cfg = config.copy()
        with open_dict(cfg):
            del cfg["hydra"]
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except Exception:
        return None


@dataclass
class CellCheck:
    """One cell of a multirun as the preflight found it."""

    num: int
    overrides: str
    problems: list[str]  # every problem of its values found, each one line naming its key
    uncomposable: bool = False  # Hydra could not compose it: an unknown option, key or type (exit code 1)
    bound: str | None = None  # its dir holds a run of another config: which, and how it differs

    @property
    def lines(self) -> list[str]:
        return self.problems + ([self.bound] if self.bound else [])


def check_cells(config: DictConfig, cells: list[list[str]], config_loader, sweep_dir: Path | None = None
                ) -> list[CellCheck]:
    """Every cell that does not compose, whose values fail the checks a cell runs before building
    anything (all of its problems, not the first), or whose dir holds a run of another config."""
    bad = []
    for num, overrides in enumerate(cells):
        check = CellCheck(num, ",".join(overrides), [])
        try:
            cfg = config_loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides))
        except Exception as e:  # Hydra's own composition errors
            check.problems, check.uncomposable = [one_line(e)], True
            bad.append(check)
            continue
        found = config_problems(cfg)
        check.problems = [one_line(e) for e in found]
        check.uncomposable = any(type(e).__module__.startswith(("hydra", "omegaconf")) for e in found)
        check.bound = cell_dir_problem(cfg, num, sweep_dir) if sweep_dir is not None else None
        if check.lines:
            bad.append(check)
    return bad


def config_problems(cfg: DictConfig) -> list[Exception]:
    """Every problem of one composed cell: each group's range checks (a group stops at its first),
    then, when they all pass, the checks across groups and of files."""
    cfg = cfg.copy()
    with open_dict(cfg):
        del cfg["hydra"]
    found = []
    for key in cfg:
        if OmegaConf.is_dict(cfg[key]):
            try:
                OmegaConf.to_object(cfg[key])
            except Exception as e:
                found.append(e)
    if found:
        return found
    try:
        typed = OmegaConf.to_object(cfg)  # the top-level range checks (seq_len, batch)
    except Exception as e:
        return [e]
    if isinstance(typed, Config):  # a training cell
        return value_problems(typed)
    if isinstance(typed, BenchConfig):
        return bench_problems(typed)
    return []


def cell_dir_problem(cfg: DictConfig, num: int, sweep_dir: Path) -> str | None:
    """Whether cell `num`'s dir holds a run of another config (a cell.run would refuse it)."""
    try:
        with open_dict(cfg):
            cfg.hydra.job.num = num
        cell_dir = sweep_dir / str(cfg.hydra.sweep.subdir)
    except Exception:  # a subdir pattern that needs more of Hydra's runtime: the cell checks its own dir
        return None
    config = task_config(cfg)
    old = rundir.bound_config(cell_dir)
    if config is None or old is None or old == rundir.fingerprint(config) or rundir.measured_nothing(cell_dir):
        return None
    return f"{cell_dir} holds a run of another config ({rundir.differences(old, rundir.fingerprint(config))})"


def stale_cells(sweep_dir: Path, n_cells: int) -> list[str]:
    """Numbered cell dirs past this sweep's last cell that hold a run: an earlier, larger sweep's."""
    return [f"{p} holds a cell of an earlier sweep that is not a cell of this one" for p in sorted(sweep_dir.iterdir())
            if p.name.isdigit() and int(p.name) >= n_cells and rundir.bound_config(p) is not None]


def duplicates(cells: list[list[str]]) -> str | None:
    """The first cells of the command line that are one cell (`-m batch=4,4`), in words, or None."""
    seen: dict[frozenset, int] = {}
    for num, cell in enumerate(cells):
        key = frozenset(cell)
        if key in seen:
            return f"cells {seen[key]} and {num} are the same cell ({','.join(cell) or 'no override'}): a value " \
                   "is listed twice"
        seen[key] = num
    return None


def is_search(config: DictConfig) -> bool:
    """The sweep is +experiment=tune's or +experiment=max_context's search (lorabench.sweep.search), whose cells it
    chooses as it goes."""
    return str(OmegaConf.select(config, "hydra.sweeper._target_", default="")).endswith(SEARCH_SWEEPER)


def other_searches(sweep_dir: Path, cells: list[list[str]], config=None) -> list[str]:
    """A search dir's searches that are not one of this command's (`config`: its own, whose search.target says
    which keys the search sets): a search of another command's."""
    from lorabench.core.results import load_searches
    from lorabench.sweep.search import SEARCH_KEYS, outer_cells, override_key, search_keys

    def binding(cell: list[str]) -> list[str]:  # the overrides a cell's result depends on (lorabench.run.rundir)
        return [o for o in cell if not rundir.ignored(override_key(o))]

    outer = [binding(c) for c in outer_cells(cells, SEARCH_KEYS if config is None else search_keys(config))]
    return [f"{sweep_dir} holds a search of another command ({','.join(r.outer)})"
            for r in load_searches(sweep_dir) if binding(r.outer) not in outer]


class Preflight(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        run_dir = Path(config.hydra.run.dir)
        check_writable(run_dir, "hydra.run.dir")
        # Before Hydra writes .hydra/ for this run: an old run's own config is moved aside with it. (The
        # nodes of a multi-node cell share its dir: each cell.run takes a lock of its own node's.)
        if OmegaConf.select(config, "train.nnodes", default=1) == 1:
            enter_dir(run_dir, task_config(config), "hydra.run.dir", keep=(rundir.LOCK_FILE,))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.global_hydra import GlobalHydra

        sweep_dir = Path(config.hydra.sweep.dir)
        check_writable(sweep_dir, "hydra.sweep.dir")
        enter_dir(sweep_dir, None, "hydra.sweep.dir", keep=())
        loader = GlobalHydra.instance().config_loader()
        cells = expand(list(config.hydra.overrides.task), config.hydra.sweeper.params, loader)
        if twins := duplicates(cells):  # two rows of one name in the report, two runs of one measurement
            print(f"preflight: {twins}; list each value once (repeats of one cell: sweep train.seed), none run",
                  file=sys.stderr)
            sys.exit(EXIT_INVALID)
        # A search's cell dirs are numbered in the order it runs its cells, not the command line's: the
        # dir binding is checked per cell as each one starts, and against the searches it holds here.
        search = is_search(config)
        bad = check_cells(config, cells, loader, None if search else sweep_dir)
        stale = other_searches(sweep_dir, cells, config) if search else stale_cells(sweep_dir, len(cells))
        if (stale or any(b.bound for b in bad)) and OmegaConf.select(config, "sweep.overwrite", default=False):
            moved = rundir.move_aside(sweep_dir)
            print(f"preflight: {sweep_dir} held runs of another sweep: moved aside to {moved} (sweep.overwrite=true)",
                  file=sys.stderr)
            bad, stale = [replace(b, bound=None) for b in bad if b.problems], []
        # (a search's cells are written as it launches them: lorabench.sweep.sweeper.BudgetSearch.launch)
        atomic_write_json(sweep_dir / CELLS_FILE, {"cells": [] if search else cells})
        report_error = check_report(config, len(cells))
        stop = report_and_decide(bad, stale, report_error, len(cells),
                                 OmegaConf.select(config, "sweep.keep_going", default=False))
        if stop:
            sys.exit(stop)
        open_trackers(config, sweep_dir)


def trackers(config: DictConfig) -> LoggerConfig | None:
    """The multirun's `logger` where it selects a tracker and its settings are valid (else each cell's checks
    name the problem, and the sweep has no tracker side)."""
    from lorabench.measure.loggers import logger_problems

    try:
        if "logger" not in config:
            return None
        # (typed again: EndSweep.now passes a copy of the node)
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(LoggerConfig), config.logger))
        return cfg if not logger_problems(cfg) and cfg.kinds else None
    except Exception:
        return None


def open_trackers(config: DictConfig, sweep_dir: Path) -> None:
    """What the cells' runs nest under (MLflow's parent run of the sweep); a tracker that cannot be reached
    stops the sweep here, in one line, before any cell runs."""
    from lorabench.measure.loggers import first_line, open_sweep

    if (cfg := trackers(config)) is None:
        return
    try:
        open_sweep(cfg, sweep_dir)
    except Exception as e:
        print(f"preflight: {first_line(e)}: the sweep's trackers cannot be reached, no cell runs", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def report_and_decide(bad: list[CellCheck], stale: list[str], report_error: str | None, n_cells: int,
                      keep_going: bool) -> int:
    """Print every problem found, one line each, and the preflight's verdict; the exit code to stop
    with (0: the sweep runs). An unknown option, key or type is a bad command line (1, as Hydra's
    own errors); anything else 2."""
    for b in bad:
        for reason in b.lines:
            print(f"invalid cell {b.num} ({b.overrides}): {reason}", file=sys.stderr)
    for line in stale + ([report_error] if report_error else []):
        print(line, file=sys.stderr)
    problems = sum(len(b.lines) for b in bad) + len(stale) + bool(report_error)
    hard = [b for b in bad if b.uncomposable or b.bound]
    if stale or hard:
        print(f"preflight: {problems} problem(s) in {n_cells} cells, none run"
              + ("; sweep.overwrite=true moves the earlier runs aside" if stale or any(b.bound for b in bad)
                 else ""), file=sys.stderr)
        return EXIT_USAGE if any(b.uncomposable for b in bad) else EXIT_INVALID
    if report_error or (bad and not keep_going):
        hint = "" if report_error else "; sweep.keep_going=true runs the valid ones"
        print(f"preflight: {problems} problem(s) in {n_cells} cells, none run{hint}", file=sys.stderr)
        return EXIT_INVALID
    print(f"preflight: {n_cells} cells composed and checked"
          + (f"; {len(bad)} invalid, recorded as failed (sweep.keep_going=true)" if bad else ""), file=sys.stderr)
    return 0


def check_report(config: DictConfig, n_cells: int) -> str | None:
    """The report's options, with the cells they will be applied to."""
    try:
        cfg = OmegaConf.to_object(config.report) if "report" in config else ReportConfig()
    except Exception as e:
        return f"report options: {one_line(e)}"
    b = cfg.baseline
    if b is not None and not (str(b).isdigit() and int(b) < n_cells) and "=" not in str(b):
        return (f"report.baseline={b!r} names no cell: give a job number from 0 to {n_cells - 1} or a cell's name "
                "(its overrides, e.g. batch=8)")
    return None


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        # Here, not at the top: the report's plotting libraries load only when a multirun ends, not
        # for every single run that loads these callbacks.
        from lorabench.measure.loggers import publish_sweep
        from lorabench.report.page import write_report

        sweep_dir = Path(config.hydra.sweep.dir)
        report_cfg = OmegaConf.to_object(config.report) if "report" in config else ReportConfig()
        out = None
        try:
            out = write_report(sweep_dir, report_cfg)
            # the answer and the cells table; the other tables wait in results.md and report.html
            print(f"\nSweep {sweep_dir}:\n{out.summary}\n\nEvery table: {sweep_dir / 'results.md'}\n"
                  f"Report: {sweep_dir / 'report.html'}")
        except Exception as e:  # the cells' own results stand; say why the report did not
            print(f"\nSweep {sweep_dir}: the report could not be written: {one_line(e)}", file=sys.stderr)
        if (logger_cfg := trackers(config)) is not None:  # (one line per tracker; a failing one says why)
            for line in publish_sweep(logger_cfg, sweep_dir, out):
                print(line, file=sys.stderr)
        reported = out is not None
        line, code = tally(sweep_dir)
        print(line, file=sys.stderr)
        # A sweep is asked for its report: without one it failed, even where every cell is a measurement
        # (a script reading exit 0 would look for results.md and find none).
        code = code or (0 if reported else EXIT_CODES[Status.failed])
        if code:
            sys.exit(code)


class EndSweep:
    """How a multirun ends between two cells (lorabench.run.cell.run calls it): after SIGTERM or Ctrl-C, or
    when a next cell would not end by sweep.deadline_s."""

    @staticmethod
    def out_of_time(cfg: DictConfig, ctx: RunContext) -> str | None:
        """After a cell of a multirun: why a next cell like it would not end by sweep.deadline_s (None: it
        would, or none is set): the command's age plus the mean wall time of the cells done with this cell's
        backend (else of all done) past the deadline."""
        deadline = OmegaConf.select(cfg, "sweep.deadline_s", default=None)
        if deadline is None:
            return None
        if not ctx.search and ctx.job_num + 1 >= len(read_cells(ctx.sweep_dir)):
            return None  # the sweep's last cell: no next one to keep from starting (a search's list grows as it goes)
        if ctx.search and ctx.job_num == search_last_job(ctx.sweep_dir):
            return None  # the cell that spent the search's cap, of its last outer cell: none follows either
        import psutil

        age = time.time() - psutil.Process().create_time()  # (a forked process: since the fork)
        done = [r for r in load_results(ctx.sweep_dir)[0] if r.total_s]
        backend = OmegaConf.select(cfg, "backend.name", default=None)
        alike = [r.total_s for r in done if r.config.get("backend", {}).get("name") == backend]
        need = mean(alike or [r.total_s for r in done] or [0.0])
        if age + need <= deadline:
            return None
        return f"sweep.deadline_s={deadline:g}: {age:.0f} s gone, a cell like the last one takes {need:.0f} s"

    @staticmethod
    def now(cfg: DictConfig, ctx: RunContext, why: str | None = None) -> NoReturn:
        """No further cell starts (Hydra's launcher would start the next one). The report and the closing
        `cells:` line now, as the multirun's end writes them, then the process ends with the sweep's exit
        code (4 when nothing failed)."""
        log.warning("%s: the sweep stops here, no further cell starts (the same command with hydra.sweep.dir=%s "
                    "runs the rest)", why or preemption.signal_name, ctx.sweep_dir)
        config = OmegaConf.create({"hydra": {"sweep": {"dir": str(ctx.sweep_dir)}}})
        for key in ("report", "logger"):
            if key in cfg:
                config[key] = cfg[key]
        SweepSummary().on_multirun_end(config)  # exits with the sweep's code
        sys.exit(EXIT_CODES[Status.interrupted])


END_SWEEP = EndSweep()


def tally(sweep_dir: Path) -> tuple[str, int]:
    """The multirun's last line (cells per status, the failed ones named) and its exit code."""
    results, incomplete = load_results(sweep_dir)
    # not started: a signal stopped the sweep before them (lorabench.run.cell.end_sweep); the others without a
    # result were killed, are still running, or have a damaged result file
    missing = rundir.missing_cells(sweep_dir, results, incomplete)
    lost = [m for m in missing if m.state != "not started"]
    counts = Counter(r.status.value for r in results) + Counter(m.state for m in missing)
    bad = [r for r in results if r.status not in MEASURED]
    line = f"cells: {len(results) + len(missing)} = " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if bad or lost:
        line += "; not measured: " + "; ".join([f"{r.job_num} ({r.cell}): {r.status.value}" for r in bad]
                                               + [f"{m.job_num} ({m.cell}): {m.state}" for m in lost])
    code = 0
    if bad or lost:
        worst = [r.status for r in bad]
        code = EXIT_CODES[Status.interrupted] if worst and all(s is Status.interrupted for s in worst) \
            and not lost else EXIT_CODES[Status.failed]
    return line, code


def one_row(result: CellResult) -> str:
    """The cell's one-row table, as the report writes it (the report's code and pandas are imported only here, after
    the cell: a cell whose values fail its checks ends in the few seconds its imports take)."""
    from lorabench.report.analysis import summary_text

    return summary_text([result])
