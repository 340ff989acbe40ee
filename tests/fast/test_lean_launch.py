"""Triton kernels launched past JITFunction.run's per-call work (lorabench.fast.lean_launch, backend.lean_launch):
the first call of each specialisation goes through Triton's run, later ones launch its kernel directly with
the same arguments; warm-ups and kernels with pre-run hooks keep Triton's run. On CPU with a stand-in for a
JITFunction (Triton needs CUDA here); on a GPU with lorabench's dropout kernel, bit for bit."""

import pytest
import torch
from conftest import requires_cuda

from lorabench.fast import lean_launch


class _Kernel:  # a compiled kernel: its launcher records what it was given
    def __init__(self, launches):
        self.function, self.packed_metadata = "cubin", "packed"
        self.run = lambda *args: launches.append(args)


class _JIT:
    """What lean_run reads of a JITFunction: pre_run_hooks and device_caches[device][4], Triton's binder
    (it specialises x on 16-byte alignment, n on divisibility by 16, BLOCK as a constexpr)."""

    def __init__(self):
        self.pre_run_hooks, self.launches, self.compiled, self.triton_runs = [], [], {}, 0
        self.device_caches = {0: (None, None, None, None, self.bind)}

    @staticmethod
    def bind(x, n, BLOCK=8, **options):
        spec = [("*fp32", "D" if x % 16 == 0 else None), ("i32", "D" if n % 16 == 0 else None), ("constexpr", BLOCK)]
        return {"x": x, "n": n, "BLOCK": BLOCK}, spec, options


def triton_run(self, *args, grid, warmup, **kwargs):  # Triton's own run: compiles once per specialisation, launches
    self.triton_runs += 1
    bound, spec, options = self.bind(*args, **kwargs)
    kernel = self.compiled.setdefault((tuple(spec), tuple(options.items())), _Kernel(self.launches))
    if not warmup:
        kernel.run(*grid, 7, kernel.function, kernel.packed_metadata, "metadata", None, None, *bound.values())
    return kernel


def test_a_kernel_found_before_is_launched_directly_with_triton_s_arguments():
    kept = []
    run = lean_launch.lean_run(triton_run, get_device=lambda: 0, get_stream=lambda d: 7, kept=kept)
    fn = _JIT()
    first = run(fn, 32, 64, grid=(4,), warmup=False)
    assert fn.triton_runs == 1 and kept == [fn]
    again = run(fn, 48, 128, grid=(5, 2), warmup=False, num_warps=4)  # other options: Triton's run again
    assert fn.triton_runs == 2
    assert run(fn, 16, 16, grid=(6,), warmup=False) is first  # same specialisation: launched directly
    assert run(fn, 48, 128, grid=lambda bound: (bound["n"] // 16,), warmup=False, num_warps=4) is again
    assert fn.triton_runs == 2
    assert fn.launches[-2] == (6, 1, 1, 7, "cubin", "packed", None, None, None, 16, 16, 8)
    assert fn.launches[-1] == (8, 1, 1, 7, "cubin", "packed", None, None, None, 48, 128, 8)
    run(fn, 16, 17, grid=(1,), warmup=False)  # n no longer divisible by 16: another kernel, Triton's run
    run(fn, 16, 16, grid=(1,), warmup=False, BLOCK=16)  # another constexpr
    run(fn, 16, 16, grid=(1,), warmup=True)
    fn.pre_run_hooks.append(lambda *a, **k: None)
    run(fn, 16, 16, grid=(1,), warmup=False)
    assert fn.triton_runs == 6 and len(fn.launches) == 7 and kept == [fn]


@pytest.mark.gpu
@requires_cuda
def test_lean_launches_give_triton_s_bits_on_gpu():
    from triton.runtime.jit import JITFunction

    from lorabench.fast.kernels import dropout as dropout_kernels

    x = torch.randn(3, 1000, device="cuda", dtype=torch.bfloat16)
    expected = [dropout_kernels.dropout(x, seed, 0.1) for seed in (5, 16, 5)]
    calls = []
    with lean_launch.patched(True):
        lean = JITFunction.run
        JITFunction.run = lambda self, *a, **k: (calls.append(1), lean(self, *a, **k))[1]
        try:
            got = [dropout_kernels.dropout(x, seed, 0.1) for seed in (5, 16, 5)]
        finally:
            JITFunction.run = lean
        assert len(dropout_kernels._dropout_kernel.__dict__[lean_launch.ATTR]) == 2  # seeds 5 and 16 specialise apart
    assert JITFunction.run is not lean and lean_launch.ATTR not in dropout_kernels._dropout_kernel.__dict__
    assert len(calls) == 3 and all(torch.equal(a, b) for a, b in zip(got, expected))
