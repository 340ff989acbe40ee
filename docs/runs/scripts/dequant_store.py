"""The nf4 dequantisation kernel against two ways of writing its output, timed as a cell runs it
(2026-11-27_h100e.sh e1).

lorabench.fast.kernels.nf4' kernel turns each packed byte into two bf16 weights and writes them with tl.interleave
(a [blocks x 2 * bytes] tensor the compiler lays out again before the store). Variants here:
  - "packed store": the two bf16 weights of a byte as one 32-bit word (weight 2i, the high nibble, in the low
    half: the GPU is little-endian), stored as int32, one word per byte, in the order the bytes were loaded;
  - "packed store, one gather": the same, the NF4 values of both nibbles read by one 8-byte gather from a
    256-entry table of fp32 pairs instead of two 4-byte gathers from the 16-entry one.
Each at 1,024, 2,048 and 4,096 packed bytes a program and 4 or 8 warps. Every output is compared bit for bit
with bitsandbytes' dequantize_4bit. Per weight shape of Qwen2.5-7B's decoder layer (double-quantised, as QLoRA
stores them). Times: 20 calls captured in one CUDA graph and replayed (as the cell's layers are), the median of
15 replays over 20, in us per call; GB/s counts the packed bytes read and the bf16 bytes written.
Last, a step's dequantisation time at Qwen2.5-7B's shapes (28 layers, each weight twice: forward and backward)
for the kernel as it is and for the fastest variant at each shape."""
import statistics

import bitsandbytes.functional as bnbf
import torch
import triton
import triton.language as tl

from lorabench.fast.kernels import nf4 as nf4_kernels


@triton.jit
def _packed_kernel(q_ptr, absmax_ptr, table_ptr, pairs_ptr, out_ptr, n_bytes, code2_ptr, absmax2_ptr, offset_ptr,
                   BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr, BYTES: tl.constexpr,
                   PAIRS: tl.constexpr):
    HALF: tl.constexpr = BLOCKSIZE // 2
    NB: tl.constexpr = BYTES // HALF
    pid = tl.program_id(0).to(tl.int64)
    block = pid * NB + tl.arange(0, NB)
    offs = block[:, None] * HALF + tl.arange(0, HALF)[None, :]
    q = tl.load(q_ptr + offs, mask=offs < n_bytes, other=0).to(tl.int32)
    some = block * HALF < n_bytes
    if NESTED:
        code = tl.load(absmax_ptr + block, mask=some, other=0).to(tl.int32)
        scale = tl.load(code2_ptr + code) * tl.load(absmax2_ptr + block // BLOCKSIZE2, mask=some, other=0.0)
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block, mask=some, other=0.0)
    if PAIRS:
        both = tl.load(pairs_ptr + q)  # int64: the high nibble's fp32 bits low, the low nibble's high
        hi = (both & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True) * scale[:, None]
        lo = (both >> 32).to(tl.uint32).to(tl.float32, bitcast=True) * scale[:, None]
    else:
        hi = tl.load(table_ptr + (q >> 4)) * scale[:, None]
        lo = tl.load(table_ptr + (q & 15)) * scale[:, None]
    hi16 = hi.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    lo16 = lo.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    tl.store(out_ptr + offs, hi16 | (lo16 << 16), mask=offs < n_bytes)


def packed(weight, state, per, warps, pairs_table=None):
    absmax, nest, blocksize2 = nf4_kernels._scales(weight, state, False)
    out = torch.empty(state.shape, dtype=torch.bfloat16, device=weight.device)
    n_bytes = state.shape.numel() // 2
    table = state.code.to(device=weight.device, dtype=torch.float32)
    pairs = table if pairs_table is None else pairs_table
    _packed_kernel[(triton.cdiv(n_bytes, per),)](
        weight.reshape(-1), absmax, table, pairs, out.view(torch.int32).reshape(-1), n_bytes, *nest,
        BLOCKSIZE=state.blocksize, BLOCKSIZE2=blocksize2, NESTED=blocksize2 > 1, BYTES=per,
        PAIRS=pairs_table is not None, enable_fp_fusion=False, num_warps=warps)
    return out


def pair_table(code: torch.Tensor) -> torch.Tensor:
    """256 int64: byte b's high nibble's fp32 bits in the low word, its low nibble's in the high word."""
    bits = code.float().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    b = torch.arange(256, device=code.device)
    return bits[b >> 4] | (bits[b & 15] << 32)


def graphed_us(fn, calls=20, replays=15):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


SHAPES = {"q/o 3584x3584": ((3584, 3584), 2), "k/v 512x3584": ((512, 3584), 2),
          "gate/up 18944x3584": ((18944, 3584), 2), "down 3584x18944": ((3584, 18944), 1)}


def main():
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    step_as_is = step_best = 0.0
    for name, (shape, per_layer) in SHAPES.items():
        w = torch.randn(shape, device=dev, dtype=torch.bfloat16) * 0.02
        q, state = bnbf.quantize_4bit(w, quant_type="nf4", compress_statistics=True)
        ref = bnbf.dequantize_4bit(q, state)
        pairs = pair_table(state.code.to(dev))
        moved = shape[0] * shape[1] * 2.5
        rows = [("lorabench.fast.kernels.nf4 as it is", lambda: nf4_kernels.dequantize(q, state))]
        for label, table in (("packed store", None), ("packed store, one gather", pairs)):
            for per in (1024, 2048, 4096):
                for warps in (4, 8):
                    rows.append((f"{label}, {per} bytes a program, {warps} warps",
                                 lambda p=per, n=warps, t=table: packed(q, state, p, n, t)))
        print(f"\n| {name} | us | GB/s | bits equal to bitsandbytes' |\n|---|---|---|---|")
        timed = []
        for label, fn in rows:
            us = graphed_us(fn)
            equal = torch.equal(fn().view(torch.int16), ref.view(torch.int16))
            timed.append((us, label, equal))
            print(f"| {label} | {us:.1f} | {moved / us / 1e3:,.0f} | {equal} |")
        best = min((t for t in timed if t[2]), key=lambda t: t[0])
        n = 2 * 28 * per_layer  # forward and backward, 28 layers, the weights of this shape in a layer
        step_as_is += n * timed[0][0] / 1e3
        step_best += n * best[0] / 1e3
        print(f"\nfastest with equal bits: {best[1]} ({best[0]:.1f} us, {timed[0][0] / best[0]:.2f}x as it is)")
    print(f"\nA Qwen2.5-7B step's dequantisation (28 layers x 7 weights x 2): as it is {step_as_is:.2f} ms, "
          f"the fastest variant per shape {step_best:.2f} ms")


if __name__ == "__main__":
    main()
