"""Three ways to treat a step's host part when projecting (docs/projection.md, "Steps tried"):
    python docs/runs/scripts/projection_host_variants.py
  add     the host part stays (scaled by the launch-floor ratio when both are measured): the model kept
  absorb  a slower target's extra device time hides host time: t = D' + max(0, host' - (D' - D))
  max     the host and the device overlap fully: t = max(D', t_source x launch ratio) for host-bound cells
Median and largest |error| of tokens/s (samples/s for the A10) against the measured cells."""

from pathlib import Path

from lorabench.report import projection as pj
from lorabench.core.results import load_results

RUNS = Path(__file__).resolve().parents[1]


def step_time(s: pj.Step, src: pj.Gpu, tgt: pj.Gpu, variant: str) -> float:
    d = s.compute + s.memory + s.data
    d2 = (s.compute * src.matmul_tflops(s.rows, src) / tgt.matmul_tflops(s.rows, src)
          + s.memory * src.achieved_gbs(src) / tgt.achieved_gbs(src) + s.data)
    ratio = tgt.launch_us / src.launch_us if src.launch_us and tgt.launch_us else 1.0
    if variant == "add":
        return d2 + s.host * ratio
    if variant == "absorb":
        return d2 + max(0.0, s.host * ratio - max(0.0, d2 - d))
    return max(d2, s.seconds * ratio) if s.host > 0.1 * s.seconds else d2 + s.host * ratio


def cells(d: Path) -> dict:
    return {r.cell: r for r in load_results(d)[0] if r.ok}


seed = {p["cell"]: p["samples_per_s"] for p in pj.measured_points(RUNS / "seed_a10/diagnostic.csv", [])}
for src_name, tgt_name in (("h100", "h200"), ("h200", "h100")):
    src, tgt, a10 = pj.gpu_option(src_name), pj.gpu_option(tgt_name), pj.gpu_option("a10")
    for variant in ("add", "absorb", "max"):
        errs, errs_a10 = [], []
        for part in ("diagnostic", "fast"):
            here = cells(RUNS / f"2026-11-24_{src_name}_projection" / part)
            there = cells(RUNS / f"2026-11-24_{tgt_name}_projection" / part)
            for name, r in here.items():
                s = pj.step_parts(r, src)
                errs.append(abs(s.tokens / step_time(s, src, tgt, variant) / there[name].metrics["perf/tokens_per_s"] - 1))
                if name in seed:
                    errs_a10.append(abs(s.samples / step_time(s, src, a10, variant) / seed[name] - 1))
        print(f"{src_name} -> {tgt_name}, {variant:6s}: median |error| {100 * pj.median(errs):5.1f}%, "
              f"largest {100 * max(errs):5.1f}% ({len(errs)} cells); {src_name} -> a10: median "
              f"{100 * pj.median(errs_a10):5.1f}%, largest {100 * max(errs_a10):5.1f}%")
