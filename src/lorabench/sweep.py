"""A multirun from start to end, as Hydra callbacks (conf/train.yaml, hydra.callbacks):

  Preflight     before the first cell: every cell is composed and its values checked (the checks a
                cell runs first, lorabench.checks.check_values); by default a sweep with an invalid cell
                stops within seconds naming each one, with sweep.keep_going=true the valid cells run and
                the invalid ones fail at their own checks. It writes cells.json (every cell's
                overrides) in the sweep dir: cells name themselves and count progress from it.
  SweepSummary  after the last cell: the report, the W&B aggregate, a last line counting cells per
                status, and the exit code (0 when every cell is ok, oom or skipped).

A run that is not a multirun gets the output-dir check only.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from lorabench.checks import check_values
from lorabench.config import Config, LoggerKind, ReportConfig
from lorabench.results import CELLS_FILE, EXIT_CODES, MEASURED, Status, atomic_write_json, load_results, read_cells

EXIT_INVALID = EXIT_CODES[Status.failed]


def expand(overrides: list[str], params, config_loader=None) -> list[list[str]]:
    """The cells of `python train.py -m <overrides>` with the config's hydra.sweeper.params, in the
    order (job numbers) of Hydra's basic sweeper, whose own expansion this calls."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = [f"{k}={v}" for k, v in (OmegaConf.to_container(params) if params else {}).items()] + list(overrides)
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(lines)
    return [list(cell) for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]


def one_line(e: BaseException) -> str:
    """An error as one line: its first line, and its cause's (Hydra's composition errors)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    cause = e.__cause__ and str(e.__cause__).strip().splitlines()
    return text + (f" ({cause[0]})" if cause and cause[0] not in text else "")


def check_writable(path: Path, key: str) -> None:
    """Stop with one line when the output dir cannot be made (Hydra would print a traceback)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lorabench-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        print(f"{key}={path}: cannot write there ({e.strerror or e}); choose another directory", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def check_cells(config: DictConfig, cells: list[list[str]], config_loader) -> list[tuple[int, str, str, bool]]:
    """(job number, overrides, reason, whether it failed to compose) of every cell whose config does
    not compose or whose values fail the checks a cell runs before building anything."""
    bad = []
    for num, overrides in enumerate(cells):
        try:
            cfg = config_loader.load_sweep_config(master_config=config, sweep_overrides=list(overrides))
            with open_dict(cfg):
                del cfg["hydra"]
            typed = OmegaConf.to_object(cfg)  # the schemas' range checks
            if isinstance(typed, Config):  # a training cell (bench.py's cells have the schemas' only)
                check_values(typed)
        except Exception as e:  # any check's error, and Hydra's own composition errors
            bad.append((num, ",".join(overrides), one_line(e), type(e).__module__.startswith(("hydra", "omegaconf"))))
    return bad


class Preflight(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        check_writable(Path(config.hydra.run.dir), "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        from hydra.core.global_hydra import GlobalHydra

        sweep_dir = Path(config.hydra.sweep.dir)
        check_writable(sweep_dir, "hydra.sweep.dir")
        loader = GlobalHydra.instance().config_loader()
        cells = expand(list(config.hydra.overrides.task), config.hydra.sweeper.params, loader)
        atomic_write_json(sweep_dir / CELLS_FILE, {"cells": cells})
        bad = check_cells(config, cells, loader)
        report_error = check_report(config, len(cells))
        for num, overrides, reason, _ in bad:
            print(f"invalid cell {num} ({overrides}): {reason}", file=sys.stderr)
        if report_error:
            print(report_error, file=sys.stderr)
        keep_going = OmegaConf.select(config, "sweep.keep_going", default=False)
        uncomposable = [b for b in bad if b[3]]
        if report_error or uncomposable or (bad and not keep_going):
            hint = "" if uncomposable or report_error else "; sweep.keep_going=true runs the valid ones"
            print(f"preflight: {len(bad) + bool(report_error)} problem(s) in {len(cells)} cells, none run{hint}",
                  file=sys.stderr)
            sys.exit(EXIT_INVALID)
        print(f"preflight: {len(cells)} cells composed and checked"
              + (f"; {len(bad)} invalid, recorded as failed (sweep.keep_going=true)" if bad else ""), file=sys.stderr)


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
        from lorabench.loggers import publish_aggregate
        from lorabench.report import write_report

        sweep_dir = Path(config.hydra.sweep.dir)
        report_cfg = OmegaConf.to_object(config.report) if "report" in config else ReportConfig()
        try:
            out = write_report(sweep_dir, report_cfg)
            print(f"\nSweep {sweep_dir}:\n{out.markdown}\n\nReport: {sweep_dir / 'report.html'}")
            if "logger" in config and LoggerKind(config.logger.kind) is LoggerKind.wandb:
                publish_aggregate(OmegaConf.to_object(config.logger), sweep_dir.name, out.results, out.axes,
                                  str(sweep_dir))
        except Exception as e:  # the cells' own results stand; say why the report did not
            print(f"\nSweep {sweep_dir}: the report could not be written: {one_line(e)}", file=sys.stderr)
        line, code = tally(sweep_dir)
        print(line, file=sys.stderr)
        if code:
            sys.exit(code)


def tally(sweep_dir: Path) -> tuple[str, int]:
    """The multirun's last line (cells per status, the failed ones named) and its exit code."""
    results, incomplete = load_results(sweep_dir)
    # cells.json's cells without a dir: a signal stopped the sweep before them (lorabench.cell.end_sweep)
    not_started = max(0, len(read_cells(sweep_dir)) - len(results) - len(incomplete))
    counts = Counter(r.status.value for r in results) + Counter({"no result": len(incomplete),
                                                                 "not started": not_started})
    bad = [r for r in results if r.status not in MEASURED]
    line = f"cells: {len(results) + len(incomplete) + not_started} = " + ", ".join(
        f"{n} {s}" for s, n in counts.items() if n)
    if bad or incomplete:
        line += "; not measured: " + "; ".join([f"{r.job_num} ({r.cell}): {r.status.value}" for r in bad]
                                               + [f"{p.name}: no result" for p in incomplete])
    code = 0
    if bad or incomplete:
        worst = [r.status for r in bad]
        code = EXIT_CODES[Status.interrupted] if worst and all(s is Status.interrupted for s in worst) \
            and not incomplete else EXIT_CODES[Status.failed]
    return line, code

