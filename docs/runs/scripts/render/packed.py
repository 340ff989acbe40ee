"""Mistral-7B on packed ShareGPT rows within 22 GiB: each backend's best of one search per seq_len."""
from .runs import bests, command, commit, gpu, layout_name, link, md_table, ratio, software, tok

PACKED = "2026-11-27_packed"  # one +experiment=tune sweep per seq_len on packed rows, one per GPU of a 4 x H200
SEQS = (512, 1024, 2048)


def both_off(r) -> bool:
    """A fast cell with layers both recomputed and offloaded and the others captured as CUDA graphs: at this run's
    commit such a cell trained on wrong LoRA gradients (fixed after it; its write-up says how). None is a best."""
    t = r.config["train"]
    return (r.config["backend"]["name"] == "fast" and t["gradient_checkpointing"] and t["checkpoint_fraction"] > 0
            and t["offload_fraction"] > 0 and r.metrics.get("graphs/layers", 0) > 0)


def packed_rows() -> list[list]:
    rows = []
    for seq in SEQS:
        b = bests(f"{PACKED}/packed_s{seq}")
        f, u, h = b["fast"], b["unsloth"], b["hf"]
        assert not any(x.cut_short for x in (f, u, h)), f"packed_s{seq}: a search cut short"
        assert not both_off(f.cell), f"packed_s{seq}: fast's best is a layout the run's fault touched"
        rows.append([seq, f.layout, f"{tok(f.cell):,.0f}", f"{f.cell.metrics['perf/mfu_pct']:.1f}", u.layout,
                     f"{tok(u.cell):,.0f}", h.layout, f"{tok(h.cell):,.0f}", ratio(tok(f.cell) / tok(u.cell)),
                     ratio(tok(f.cell) / tok(h.cell))])
    return rows


def packed() -> str:
    one = bests(f"{PACKED}/packed_s512")["fast"].cell
    head = ["seq", "fast's best", "tok/s", "MFU %", "Unsloth's best", "tok/s", "hf's best", "tok/s",
            "fast over Unsloth", "fast over hf"]
    return "\n\n".join([
        "## Packed ShareGPT rows",
        "The reference recipe on real conversations: 2,000 ShareGPT conversations packed into rows of `seq` tokens "
        f"(`data.packing=true`), within 22 GiB of one {gpu(one)}, each backend searched as above. fast and hf keep "
        "the packed samples apart (fast with PyTorch's variable-length flash attention, hf with a block-diagonal "
        "mask); Unsloth takes each batch as its padding-free input, the samples end to end with their lengths. "
        "Neither flash-attn nor xformers was installed, so Unsloth's attention over them went through its SDPA path: "
        "read its column as Unsloth without its variable-length kernels.",
        md_table(head, packed_rows()),
        "```bash\n" + "\n".join(command(f"{PACKED}/packed_s{s}") for s in SEQS) + "\n```",
        "`data.path` held the 2,000 conversations that `data=sharegpt` picks by default (`data.max_samples=2000`, "
        "`data.seed=0`), written out as JSONL; `data=sharegpt data.packing=true` trains on the same rows.",
        f"Run dirs: {', '.join(link(f'{PACKED}/packed_s{s}') for s in SEQS)} (commit {commit(one)}; "
        f"{software(one)}). A fault this run found (fast cells with layers both recomputed and offloaded trained on "
        "wrong LoRA gradients, fixed after it) touched none of these bests: "
        + link(f"{PACKED}/README.md") + ".",
        packed_h100()])


H100 = "2026-12-07d_h100_qwen35_liger_packed"  # seq 2048 again: Unsloth's packing on, its route recorded


def packed_h100() -> str:
    """seq 2048 on an H100: fast's and Unsloth's cells around their searches' bests, with Unsloth's packing route
    as the run recorded it (model.unsloth_packing, model.unsloth_varlen_kernel)."""
    f, u = bests(f"{H100}/packed_s2048_fast")["fast"], bests(f"{H100}/packed_s2048_unsloth")["unsloth"]
    off = bests(f"{H100}/packed_s2048_unsloth_b8")["unsloth"].cell
    m = u.cell.model
    assert m["unsloth_packing"], "Unsloth's packing was off in its best cell"
    return (f"Again at seq 2048 on one {gpu(f.cell)}, Unsloth's packing on and its route recorded: fast "
            f"{f.layout} {tok(f.cell):,.0f} tok/s at {f.cell.metrics['mem/peak_reserved_gib']:.1f} GiB, Unsloth "
            f"{u.layout} {tok(u.cell):,.0f} at {u.cell.metrics['mem/peak_reserved_gib']:.1f} GiB through "
            f"{m['unsloth_varlen_kernel']} (no xformers for torch {u.cell.env['versions']['torch']} on "
            f"PyPI, nor flash-attn: Unsloth's own route without them), fast over Unsloth "
            f"{ratio(tok(f.cell) / tok(u.cell))}; Unsloth with nothing recomputed fits b1 only ({layout_name(off)}, {tok(off):,.0f}). Each ran a search of 3 cells around the layout its "
            f"earlier search found best ({link(H100 + '/README.md')}; commit {commit(f.cell)}).")
