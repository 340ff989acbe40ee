"""lorabench's search as a Hydra sweeper plugin: Hydra instantiates a sweeper only from a class defined
under the hydra_plugins package (hydra.core.plugins), so the class lives here and the work in
lorabench.sweep.search. Selected by conf/experiment/tune.yaml (hydra.sweeper._target_). The report is written
again from here once search.json holds every search."""

import sys
from pathlib import Path

from lorabench.sweep.sweeper import BudgetSearch as _BudgetSearch


class BudgetSearch(_BudgetSearch):
    def rewrite_report(self, sweep_dir: Path) -> None:
        # (imported here: Hydra imports every plugin module when it starts, and the report's pandas and
        # matplotlib take ~2 s)
        from omegaconf import OmegaConf

        from lorabench.core.config import ReportConfig
        from lorabench.report.page import write_report

        report = OmegaConf.to_object(self.config.report) if "report" in self.config else ReportConfig()
        try:
            write_report(sweep_dir, report)
        except Exception as e:  # the cells' results and search.json stand
            print(f"search: the report could not be written again: {e}", file=sys.stderr)
