"""Each backend's best of one search per model or recipe (sweeps named <prefix>_<backend> in one run dir, run on one
GPU in turn): its layout, tok/s and peak GiB, or why none of its cells measured; fast over Unsloth and over hf."""
from .runs import RUNS, bests, failed, md_table, ratio, tok

BACKENDS = ("fast", "unsloth", "hf")
HEAD = ["", "fast's best", "Unsloth's best", "hf's best", "fast over Unsloth", "fast over hf"]


def _best(run: str, prefix: str, backend: str):
    sweep = f"{run}/{prefix}_{backend}"
    return bests(sweep).get(backend) if (RUNS / sweep).is_dir() else None


def _cell(run: str, prefix: str, backend: str, best, unmeasured: dict) -> str:
    if best is None:
        return unmeasured.get(backend) or failed(f"{run}/{prefix}_{backend}")
    gib = best.cell.metrics["mem/peak_reserved_gib"]
    cut = f" (search cut short: {best.cut_short})" if best.cut_short else ""
    return f"{best.layout}: {tok(best.cell):,.0f} tok/s, {gib:.1f} GiB{cut}"


def searched_table(run: str, rows: tuple[tuple[str, str], ...], unmeasured: dict | None = None) -> str:
    """One row per (label, sweep prefix); `unmeasured`: {backend: why} where a backend's sweep left no cell."""
    out = []
    for label, prefix in rows:
        b = {k: _best(run, prefix, k) for k in BACKENDS}
        over = [ratio(tok(b["fast"].cell) / tok(b[k].cell)) if b["fast"] and b[k] else "-" for k in ("unsloth", "hf")]
        out.append([label, *(_cell(run, prefix, k, b[k], unmeasured or {}) for k in BACKENDS), *over])
    return md_table(HEAD, out)
