"""Triton kernels launched without most of Triton's per-call host work (backend.lean_launch).

A fast-path decoder layer launches ~30 Triton kernels a step from Python (Liger's norms, RoPE and gated
MLP, lorabench's nf4 dequantisation, seeded dropout and input gradients, forward and backward). Each goes
through `JITFunction.run`, which at every call, besides binding the arguments: reads Triton's debug and
instrumentation knobs (environment variables), resolves the driver's current device and stream through a
lazy proxy, turns the options into a string for the cache key, checks the kernel's globals, reads the
launch-hook knobs twice and builds launch metadata. On a host where a torch.mm costs 21.8 us to launch,
one seeded-dropout launch cost 30.5 us (docs/results.md, host section), the kernel itself a few us.

Here `JITFunction.run` keeps Triton's own binder (its C specialisation of each argument: dtype, 16-byte
alignment, integers equal to 1 or divisible by 16, constexpr values), so a launch reuses a compiled kernel
exactly where Triton would pick the same one; the first call of each specialisation goes through Triton's
own `run` (which compiles or finds the kernel, and launches it), later ones launch that kernel directly.
Left out at those later calls, each fixed for the cell: the knobs (read once here; a cell with Triton's
debug, instrumentation or launch hooks set keeps Triton's own `run`), the globals check (a kernel's globals
are its module's constants), pre-run hooks (a kernel with any keeps Triton's `run`). The same kernels run
on the same arguments: nothing computed changes.
"""

from __future__ import annotations

import contextlib
from typing import Callable

ATTR = "lorabench_lean"  # on each JITFunction: {its binder's specialisation and options: the kernel's launch}


def lean_run(original: Callable, get_device: Callable[[], int], get_stream: Callable[[int], int],
             kept: list) -> Callable:
    """A `JITFunction.run` that launches a kernel found before directly. `original` is Triton's run;
    get_device/get_stream are Triton's driver's (the current device's index and its current raw stream);
    `kept` gets each JITFunction that keeps kernels (so that they can be dropped)."""

    def run(self, *args, grid, warmup, **kwargs):
        if warmup or self.pre_run_hooks:
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        device = get_device()
        bound, specialization, options = self.device_caches[device][4](*args, **kwargs)  # Triton's binder
        try:
            key = (device, *specialization, *options.items())
            if ATTR not in self.__dict__:
                self.__dict__[ATTR] = {}
                kept.append(self)
            found = self.__dict__[ATTR].get(key)
        except TypeError:  # an unhashable constexpr value: Triton's own path
            return original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if found is None:  # compiled or found, and launched, by Triton; its kernel kept for the next calls
            kernel = original(self, *args, grid=grid, warmup=warmup, **kwargs)
            if kernel is not None and not hasattr(kernel, "result"):  # not a kernel still compiling
                self.__dict__[ATTR][key] = (kernel, kernel.run, kernel.function, kernel.packed_metadata)
            return kernel
        kernel, launch, function, packed = found
        if callable(grid):
            grid = grid(bound)
        n = len(grid)
        launch(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, get_stream(device), function, packed,
               None, None, None, *bound.values())  # no launch metadata, no launch hooks (checked unset)
        return kernel

    return run


TRITON = ("3.6.",)  # the releases whose JITFunction.run (its binder's place, its launcher's arguments) this follows


def runs() -> str | None:
    """Why Triton's own run must stay (another Triton, or a knob that the lean run would read once), or None."""
    import triton

    if not triton.__version__.startswith(TRITON):
        return f"written for Triton {'/'.join(v + 'x' for v in TRITON)}, this is {triton.__version__}"
    from triton import knobs

    if knobs.runtime.debug or knobs.compilation.instrumentation_mode not in ("", None):
        return "Triton's debug or instrumentation mode is on"
    # Triton 3.6's hooks are HookChains, empty unless a profiler (Proton) adds one; earlier ones None
    if any(getattr(h, "calls", h is not None) for h in (knobs.runtime.launch_enter_hook,
                                                        knobs.runtime.launch_exit_hook)):
        return "a Triton launch hook is set"
    return None


@contextlib.contextmanager
def patched(on: bool):
    """Within: every Triton kernel launched through `lean_run`; Triton's run restored after, and the kernels
    each JITFunction kept dropped (a next cell may set other knobs)."""
    if not on:
        yield
        return
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    why = runs()
    if why is not None:
        import logging

        logging.getLogger(__name__).info("backend.lean_launch: %s, Triton's own launch kept", why)
        yield
        return
    original, kept = JITFunction.run, []
    JITFunction.run = lean_run(original, driver.active.get_current_device, driver.active.get_current_stream, kept)
    try:
        yield
    finally:
        JITFunction.run = original
        for fn in kept:
            fn.__dict__.pop(ATTR, None)
