"""The bottleneck breakdown: categories that partition a profiled step, checked against the step
time the meter measured, and a classifier that names kernels the way a reader of a profile would."""

import pytest
from conftest import EPS64, read_steps, run_in_process

from lorabench.measure.profile import CATEGORIES, classify


@pytest.mark.parametrize("names, expected", [
    # GPU kernels with the operators that launched them, innermost first (as the profiler links them)
    (["void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>", "bitsandbytes::dequantize_4bit",
      "autograd::engine::evaluate_function: MatMul4BitBackward"], "dequant"),
    # bitsandbytes' gemm_4bit op without a fused kernel: dequantise, then a GEMM that is a matmul
    (["void kDequantizeBlockwise<__nv_bfloat16, 512, 64, 8, 2>", "bitsandbytes::dequantize_4bit",
      "bitsandbytes::gemm_4bit"], "dequant"),
    (["nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT", "aten::mm", "aten::matmul", "bitsandbytes::gemm_4bit"],
     "matmul"),
    (["void kgemm_4bit_inference_naive<__nv_bfloat16>", "bitsandbytes::gemm_4bit"], "matmul"),
    (["void kInt8VectorQuant<__nv_bfloat16>", "bitsandbytes::int8_vectorwise_quant"], "dequant"),
    (["nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "aten::mm", "MmBackward0"], "matmul"),
    (["sm90_xmma_gemm_bf16bf16_bf16f32", "aten::addmm", "aten::linear"], "matmul"),
    (["cutlass_80_wmma_tensorop_bf16_s161616gemm", "aten::bmm", "aten::_scaled_dot_product_attention_math",
      "aten::scaled_dot_product_attention"], "attention"),
    (["pytorch_flash::flash_bwd_kernel", "aten::_flash_attention_backward"], "attention"),
    (["void at::native::vectorized_elementwise_kernel<4, mul>", "aten::mul", "aten::_foreach_mul_"], "optimizer"),
    (["kOptimizer32bit2State", "bitsandbytes::optimizer_update_8bit_blockwise",
      "Optimizer.step#PagedAdamW8bit.step"], "optimizer"),
    (["cunn_SoftMaxForward", "aten::_log_softmax", "aten::log_softmax", "aten::cross_entropy_loss"], "loss"),
    (["void at::native::nll_loss_backward_reduce_cuda_kernel_2d", "aten::nll_loss_backward"], "loss"),
    (["Memcpy HtoD (Pageable -> Device)", "aten::copy_", "aten::_to_copy"], "data"),
    (["void at::native::vectorized_elementwise_kernel<4, silu>", "aten::silu"], "elementwise"),
    (["triton_red_fused__to_copy_mean_pow_rsqrt", "aten::rsqrt"], "elementwise"),
    (["_sum_mm_kernel", "_ProjectionsBackward"], "matmul"),  # lorabench.fast.kernels.grad' Triton GEMM
    # a copy inside a matrix product moves memory: eager attention's torch.matmul of an expanded operand,
    # autocast's cast of an fp32 weight inside aten::linear (31.6 and 7.9 ms of an H100 step:
    # docs/runs/2026-11-27_seed_check)
    (["void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda>", "aten::copy_",
      "aten::_reshape_alias", "aten::matmul"], "elementwise"),
    (["void at::native::unrolled_elementwise_kernel<direct_copy_kernel_cuda>", "aten::copy_", "aten::_to_copy",
      "aten::linear"], "elementwise"),
    (["Memcpy DtoD (Device -> Device)", "aten::copy_", "aten::contiguous", "aten::bmm"], "elementwise"),
    (["void at::native::vectorized_elementwise_kernel<4, mul>", "aten::mul", "aten::_flash_attention_forward"],
     "elementwise"),
])
def test_kernels_are_classified_by_what_launched_them(names, expected):
    assert classify(names) == expected


def test_breakdown_partitions_the_measured_step_time(tmp_path, monkeypatch):
    """3 profiled steps of the tiny model on CPU: every category accounted, their sum equal to the
    profiled step, and that equal to the meter's own clock for the same steps within 5% + 2 ms
    (the two clocks are read a few microseconds apart at each step end; the tolerance covers the
    profiler's own bookkeeping between them). The analysis after the last profiled step (made to
    take 1 s more here) is in no step's time."""
    import time

    from lorabench.measure import profile

    slow = profile.breakdown
    monkeypatch.setattr(profile, "breakdown", lambda *a, **k: (time.sleep(1.0), slow(*a, **k))[1])
    result = run_in_process(["train.max_steps=8", "train.untimed_steps=2", "train.profile_steps=3",
                             "data.max_samples=64"], tmp_path)
    assert result.status.value == "ok", result.error
    m = result.metrics
    assert m["prof/steps"] == 3 and m["count/timed_steps"] == 8 - 2 - 3  # profiled steps are not timed
    parts = sum(m[f"prof/{c}_ms"] for c in CATEGORIES)
    # The categories partition each step: the same time added up in float64 interval by interval (fewer
    # than 10^6 intervals a step: within 10^6 x eps64 = 2.2e-10 of the step)
    assert parts == pytest.approx(m["prof/step_ms"], rel=1e6 * EPS64)
    assert all(m[f"prof/{c}_ms"] >= 0 for c in CATEGORIES)
    assert abs(m["prof/step_ms"] - m["prof/measured_step_ms"]) <= 0.05 * m["prof/measured_step_ms"] + 2.0
    # The tiny model does real work of each kind on CPU; no bitsandbytes kernel runs here.
    for c in ("matmul", "attention", "elementwise", "loss", "optimizer", "data"):
        assert m[f"prof/{c}_ms"] > 0, c
    assert m["prof/dequant_ms"] == 0
    assert m["prof/top"] == max(CATEGORIES, key=lambda c: m[f"prof/{c}_ms"])
    assert "aten::mm" in (tmp_path / "profile.txt").read_text()
    steps = read_steps(tmp_path)
    assert [s["step"] for s in steps if s.get("profiled")] == [3, 4, 5]
    assert steps[5]["timed"] and steps[5]["time_s"] < 0.9  # the first timed step, right after the analysis
    # and the timed window is the timed steps, back to back, without the analysis before them
    assert m["time/window_s"] == sum(s["time_s"] for s in steps if s["timed"])  # the same floats, same order


def test_profile_steps_must_leave_a_timed_step():
    from conftest import compose_cfg
    from omegaconf import OmegaConf

    with pytest.raises(ValueError, match="train.profile_steps must be in"):
        OmegaConf.to_object(compose_cfg(["train.max_steps=6", "train.untimed_steps=2", "train.profile_steps=4"]))


def test_a_kernel_named_as_its_host_range_is_work_and_a_marked_mirror_is_not():
    """torch.compile launches each generated Triton kernel inside a host range of the kernel's own name; kineto
    marks only the device-side mirrors of host annotations (the step range) as user annotations. A 100 us step:
    a compiled SwiGLU kernel 10-40 under its namesake range is elementwise, the step's mirror is no work."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from lorabench.measure.profile import STEP_RANGE, breakdown

    fused = "triton_poi_fused_mul_silu_0"
    step = NS(id=1, name=STEP_RANGE, device_type=DeviceType.CPU, time_range=NS(start=0, end=100), cpu_parent=None,
              cpu_children=[])
    launch = NS(id=2, name=fused, device_type=DeviceType.CPU, time_range=NS(start=5, end=9), cpu_parent=step,
                cpu_children=[])
    step.cpu_children.append(launch)

    def device(name, start_us, end_us, by, mirror):
        return NS(name=lambda: name, linked_correlation_id=lambda: by.id, is_user_annotation=lambda: mirror,
                  start_ns=lambda: start_us * 1000, duration_ns=lambda: (end_us - start_us) * 1000)

    [ms], _ = breakdown([step, launch], [device(fused, 10, 40, launch, False), device(STEP_RANGE, 0, 100, step, True)])
    assert {k: round(v * 1e3, 6) for k, v in ms.items() if v} == {"elementwise": 30, "idle": 70, "step_ms": 100}


def test_device_timeline_is_partitioned_by_category():
    """The CUDA path on a hand-made timeline (us): a 100 us step whose DataLoader call takes 0-20,
    then a host-to-device copy 20-25, a GEMM 30-60 launched by aten::mm, an optimizer kernel 70-90.
    Device idle inside the DataLoader call is data; other idle is idle. An offloading copy (28-65, on
    a stream of its own) is not part of the partition: the GEMM keeps its time."""
    from types import SimpleNamespace as NS

    from torch.autograd import DeviceType

    from lorabench.core.devices import COPY_RANGE
    from lorabench.measure.profile import DATA_RANGE, STEP_RANGE, breakdown

    def op(id_, name, start, end, parent=None):
        e = NS(id=id_, name=name, device_type=DeviceType.CPU, time_range=NS(start=start, end=end),
               cpu_parent=parent, cpu_children=[])
        if parent:
            parent.cpu_children.append(e)
        return e

    def kernel(name, start_us, end_us, launched_by):
        return NS(name=lambda: name, linked_correlation_id=lambda: launched_by.id,
                  start_ns=lambda: 5_000 + start_us * 1000, duration_ns=lambda: (end_us - start_us) * 1000)

    step = op(1, STEP_RANGE, 0, 100)
    loader = op(2, DATA_RANGE + "#_SingleProcessDataLoaderIter.__next__", 0, 20, step)
    copy = op(3, "aten::copy_", 20, 21, step)
    mm = op(4, "aten::mm", 28, 29, step)
    opt = op(5, "Optimizer.step#AdamW.step", 65, 69, step)
    add = op(6, "aten::_foreach_add_", 66, 67, opt)
    out = op(7, "aten::copy_", 27, 28, op(8, COPY_RANGE, 27, 28, step))
    kernels = [kernel("Memcpy HtoD (Pageable -> Device)", 20, 25, copy), kernel("nvjet_tst_gemm", 30, 60, mm),
               kernel("Memcpy DtoH (Device -> Pinned)", 28, 65, out),
               kernel("multi_tensor_apply_kernel", 70, 90, add),
               kernel(STEP_RANGE, 0, 100, step)]  # kineto's device-side mirror of the step range: not work
    [ms], by_who = breakdown([step, loader, copy, mm, opt, add, out, out.cpu_parent], kernels, trace_start_ns=5_000)
    us = {k: round(v * 1e3, 6) for k, v in ms.items()}
    assert us == {"matmul": 30, "dequant": 0, "attention": 0, "elementwise": 0, "loss": 0, "optimizer": 20,
                  "data": 25, "idle": 25, "step_ms": 100}
    assert by_who["matmul", "nvjet_tst_gemm <- aten::mm"] == pytest.approx(0.030)
    # the idle time by what the device waited for: the GEMM, the optimizer's kernel, the step's end
    assert {k[1]: round(v * 1e3, 6) for k, v in by_who.items() if k[0] == "idle" and v} == {
        "before aten::mm": 5, "before aten::_foreach_add_ in Optimizer.step#AdamW.step": 10,
        "after the step's last work, to its end": 10}
