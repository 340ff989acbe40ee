"""A multirun's cells, as Hydra's basic sweeper expands them: one home below everything that needs
them (the preflight and the report's end in lorabench.sweep.callbacks, the search's sweeper in lorabench.sweep.search,
the Kubernetes Jobs in lorabench.sweep.k8s), so none of those imports another for it."""

from __future__ import annotations

from omegaconf import OmegaConf


def expand(overrides: list[str], params, config_loader=None) -> list[list[str]]:
    """The cells of `python train.py -m <overrides>` with the config's hydra.sweeper.params, in the
    order (job numbers) of Hydra's basic sweeper, whose own expansion this calls."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    # (resolved: a param may read the config, as +experiment=time_to_loss's train.seed: range(0,${quality.repeats}))
    lines = [f"{k}={v}" for k, v in (OmegaConf.to_container(params, resolve=True) if params else {}).items()]
    lines += list(overrides)
    parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(lines)
    return [list(cell) for batch in BasicSweeper.split_arguments(parsed, None) for cell in batch]
