"""The nf4 dequantisation kernel's time on the GPU against a copy of the same bytes (2026-11-27_searched.sh).

Per weight shape of Qwen2.5-7B's decoder layer (q, k, o, gate, down), double-quantised as QLoRA stores them:
lorabench.fast.kernels.nf4' kernel as it is (its program size chosen by the weight's size; at 2eaaca1, the kernel
before it, which gathered one scale per weight: runs/2026-11-27_searched/dequant_c1.md), the same kernel at
several program sizes and warp counts, bitsandbytes' own dequantize_4bit, and a plain bf16 copy of the
output's size (what the memory allows).
Each variant's output is compared bit for bit with the kernel's as it is. Times are the median of 30 calls
(cuda_timing.median_ms); GB/s counts the packed bytes read and the bf16 bytes written (the copy: its bytes
read and written).
Prints one markdown table per shape."""
import bitsandbytes.functional as bnbf
import torch
import triton
from cuda_timing import median_ms

from lorabench.fast.kernels import nf4 as nf4_kernels


def main():
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for name, shape in {"q/o 3584x3584": (3584, 3584), "k 512x3584": (512, 3584),
                        "gate 18944x3584": (18944, 3584), "down 3584x18944": (3584, 18944)}.items():
        w = torch.randn(shape, device=dev, dtype=torch.bfloat16) * 0.02
        q, state = bnbf.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
        ref = nf4_kernels.dequantize(q, state)
        moved = shape[0] * shape[1] * 2.5  # bytes: 0.5 packed read, 2 written (scales left out: 1/64 of it)
        rows = [("lorabench.fast.kernels.nf4 as it is", lambda: nf4_kernels.dequantize(q, state), True),
                ("bitsandbytes dequantize_4bit", lambda: bnbf.dequantize_4bit(q, state), True),
                ("bf16 copy of the output's size (2 bytes read, 2 written)", lambda: ref.clone(), None)]
        for bytes_ in (1024, 2048, 4096, 8192):
            for warps in (4, 8):
                rows.append((f"by block, {bytes_} bytes a program, {warps} warps", lambda b=bytes_, n=warps:
                             nf4_kernels.dequantize(q, state, program_bytes=b, num_warps=n), True))
        print(f"\n| {name} | ms | GB/s | bits equal |\n|---|---|---|---|")
        for label, fn, check in rows:
            ms = median_ms(fn)
            equal = "" if check is None else str(torch.equal(fn().view(torch.int16), ref.view(torch.int16)))
            bytes_moved = moved * 4 / 2.5 if check is None else moved
            print(f"| {label} | {ms:.4f} | {bytes_moved / ms / 1e6:,.0f} | {equal} |")


if __name__ == "__main__":
    main()
