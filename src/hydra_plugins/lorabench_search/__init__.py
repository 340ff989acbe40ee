"""lorabench's search as a Hydra sweeper plugin: Hydra instantiates a sweeper only from a class defined
under the hydra_plugins package (hydra.core.plugins), so the class lives here and the work in
lorabench.search. Selected by conf/experiment/tune.yaml (hydra.sweeper._target_)."""

from lorabench.search import BudgetSearch as _BudgetSearch


class BudgetSearch(_BudgetSearch):
    pass
