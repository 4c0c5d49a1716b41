"""Probe side: window scheduling arithmetic, a real sampled CPU window, and its raw records giving
the same window as the monitor's Chrome-trace loader on the same profiled step."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train]); the monitor-only install has none")

from flowtop.monitor.kernels.aggregate import aggregate  # noqa: E402
from flowtop.monitor.kernels.chrome import load_trace  # noqa: E402
from flowtop.monitor.kernels.trace import CPU_OP, KERNEL, window_from_wire  # noqa: E402
from probe import wire  # noqa: E402
from probe.kernels import schedule as kernel_schedule
from probe.kernels.records import records_from_kineto  # noqa: E402
from probe.kernels.windows import KernelWindowSampler, WindowScheduler  # noqa: E402

KEY = wire.RankKey("j", "h", 1, 0, 0)


def _through_wire(fields: dict) -> dict:
    """What the monitor receives: the fields after encode and a validating decode."""
    return dict(wire.decode(wire.encode("kernels", KEY, 1, 1.0, fields)).fields)

# --- scheduling arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize(("cost_s", "typical_s", "interval"), [
    (0.05, 0.2, 50),  # large step: 0.05 / (0.005 × 0.2)
    (0.0068 * 1.8, 0.0068, 90),  # small step at +180 % (docs/design.md, "Overheads"): 1.8 / 0.02
    (0.01, 0.1, 20),  # exactly 100 ms is "large": 0.01 / (0.005 × 0.1)
    (0.01, 0.0999, 6),  # just below: 0.01 / (0.02 × 0.0999) = 5.005 → 6 → clamped to 10
    (0.0, 0.2, 10),  # free windows still wait the minimum
    (-0.3, 0.2, 10),  # a window faster than typical counts as free
    (500.0, 0.2, 10_000),  # clamped to the maximum
    (0.05, None, 10_000),  # no step time: only the wall-clock cap brings the next window
])
def test_next_interval(cost_s: float, typical_s: float | None, interval: int) -> None:
    assert WindowScheduler is kernel_schedule.WindowScheduler  # re-exported by probe.kernels.windows
    s = WindowScheduler()
    assert s.record(7, 100.0, cost_s, typical_s) == max(10, interval)
    assert s.interval_steps == max(10, interval)


def test_interval_keeps_amortised_cost_in_budget() -> None:
    s = WindowScheduler(min_interval_steps=1, min_request_s=0)
    for cost, typical in [(0.05, 0.2), (0.013, 0.0068), (1.0, 0.5), (0.0007, 0.001)]:
        n = s.record(0, 0.0, cost, typical)
        assert cost / (n * typical) <= s.budget(typical)
        assert cost / ((n - 1) * typical) > s.budget(typical)  # and is the shortest such interval


def test_due() -> None:
    s = WindowScheduler(min_interval_steps=10, max_interval_s=60.0, align_steps=False)
    assert not s.due(100, 0.0)  # first step seen: anchor
    assert not s.due(109, 1.0) and s.due(110, 1.0)  # interval starts at the minimum
    s.record(110, 2.0, 0.05, 0.2)  # next in 50 steps
    assert not s.due(159, 10.0) and s.due(160, 10.0)
    assert not s.due(115, 62.0)  # wall cap reached, but fewer than min_interval_steps
    assert s.due(120, 62.0)  # wall cap: 60 s since the last window
    # A request within cost / budget = 0.05 / 0.005 = 10 s of the last window is refused.
    assert not s.request_now(11.9) and s.refused == 1 and not s.requested
    assert s.request_now(12.1) and s.request_now(12.2) and s.refused == 1  # pending: merged
    assert s.due(111, 12.3)  # manual trigger: the next step, whatever the interval
    s.record(111, 12.4, 0.05, 0.2)
    assert not s.requested and not s.due(112, 12.5)


# --- a real sampled window on CPU ---------------------------------------------------------------


def _train(sampler: KernelWindowSampler, steps: int, typical: float | None = None) -> list[dict]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 16, bias=False)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x = torch.randn(32, 64)
    windows = []
    for step in range(steps):
        sampler.begin_step(step)
        opt.zero_grad()
        layer(x).square().mean().backward()
        opt.step()
        w = sampler.end_step(step, typical)
        if w is not None:
            windows.append(w)
    return windows


def test_sampled_cpu_window_reaches_the_operator_table() -> None:
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=2, max_interval_steps=3, align_steps=False), cuda=False)
    windows = _train(sampler, 6, typical=1.0)
    # anchored at step 0: windows at 2, then 2 + max(2, ceil(cost / (0.02 × 1 s))) = 4 for cost < 40 ms
    assert [w["step"] for w in windows] == [2, 4] and [w["window"] for w in windows] == [1, 2]
    w = windows[0]
    assert w["device"] == "cpu" and w["step_dur_us"] > 0 and w["cost_s"] >= 0
    assert set(w) == {"names", "ops", "acts", "window", "step", "device", "step_dur_us", "cost_s", "typical_step_us"}
    assert w["acts"] == [] and w["typical_step_us"] == 1e6  # no device activities on a CPU window
    # what the wire accepts, end to end
    received = _through_wire(w)
    assert received == w
    window = window_from_wire(received)
    assert (window.step, window.window, window.device) == (2, 1, "cpu")
    stats = aggregate(window)
    mm = [k for k in stats.kernels if k.name == "aten::mm"]
    # forward x·Wᵀ (32×64)·(64×16) and the weight gradient (16×32)·(32×64): 2·32·64·16 each
    assert len(mm) == 1 and mm[0].calls == 2 and mm[0].flops == 2 * 2 * 32 * 64 * 16
    assert mm[0].category == "gemm" and mm[0].tflops > 0
    assert [k.name for k in stats.kernels if k.flops is not None] == ["aten::mm"]  # linear → matmul → mm
    top_level = {window.names[e.name] for e in window.events if e.kind == CPU_OP}
    assert {"aten::linear", "aten::square", "aten::mean", "aten::add_"} <= top_level  # add_: SGD's update
    # exclusive times of the operators add up to the busy time of the top-level operators
    total = sum(k.total_us for k in stats.kernels)
    assert total == pytest.approx(stats.anatomy.busy_us, rel=1e-6)
    assert sampler.windows == 2 and sampler.last_convert_s is not None


def test_caller_driven_protocol() -> None:
    """The probe runtime asks ``due`` first and calls begin/end only around sampled steps."""
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=2, align_steps=False), cuda=False)
    assert not sampler.due(0, typical_step_s=0.5)  # anchors the schedule
    assert sampler.typical_step_s == 0.5
    assert not sampler.due(1) and sampler.due(2)
    assert sampler.begin_step(2) is True and not sampler.due(3)  # one window at a time
    torch.ones(4).sum()
    window = sampler.end_step(2, typical_step_s=0.5)
    assert window is not None and window["step"] == 2 and sampler.begin_step(3) is False


def test_first_window_is_a_warm_up() -> None:
    # a 1 ns "typical" step makes any window cost the maximum interval — except the first one,
    # whose cost includes the profiler's one-off initialisation: the second follows at the minimum
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=2, max_interval_steps=1000, align_steps=False), cuda=False)
    assert [w["step"] for w in _train(sampler, 8, typical=1e-9)] == [2, 4]
    assert sampler.scheduler.interval_steps == 1000


def test_request_now_and_failures_never_raise(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1000, min_request_s=0), cuda=False)
    assert _train(sampler, 3) == []
    sampler.request_now()
    assert [w["step"] for w in _train(sampler, 1)] == [0]
    assert sampler.typical_step_s is not None and sampler.typical_step_s > 0  # its own EWMA

    def broken(*args: object, **kwargs: object) -> dict:
        raise RuntimeError("kineto changed")

    monkeypatch.setattr("probe.kernels.windows.records_from_kineto", broken)
    sampler.request_now()
    assert _train(sampler, 2) == []
    assert not sampler.enabled and not torch.autograd.profiler._is_profiler_enabled
    assert "kernel windows disabled" in capsys.readouterr().err
    sampler.request_now()
    assert _train(sampler, 1) == []  # stays off


def test_windows_too_large_to_send_are_dropped(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("probe._log._seen", set())  # the warning is printed once per process
    # by record count
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1, min_request_s=0), cuda=False, max_events=5)
    sampler.request_now()
    assert _train(sampler, 1) == [] and sampler.enabled and sampler.windows == 0
    # by packed size: every window measured, against a 2 kB frame, then an ample one
    monkeypatch.setattr("probe.kernels.windows._MEASURE_ABOVE", 0)
    monkeypatch.setattr("probe.kernels.windows._FRAME_ROOM", 2000)
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1, min_request_s=0), cuda=False)
    sampler.request_now()
    assert _train(sampler, 1) == [] and sampler.enabled
    monkeypatch.setattr("probe.kernels.windows._FRAME_ROOM", wire.MAX_FRAME_BYTES)
    sampler.request_now()
    (w,) = _train(sampler, 2)  # never at the boundary where the last session stopped: step 1
    assert 2000 < len(wire.encode("kernels", KEY, 1, 1.0, w)) < wire.MAX_FRAME_BYTES
    assert "too large to send" in capsys.readouterr().err


def test_another_profiler_session_is_left_alone() -> None:
    sampler = KernelWindowSampler(WindowScheduler(), cuda=False)
    sampler.request_now()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert _train(sampler, 1) == []
    assert sampler.enabled and sampler.scheduler.requested  # still wanted: taken when free
    assert [w["step"] for w in _train(sampler, 1)] == [0]


# --- the probe's raw records and the Chrome trace of the same step give one window ---------------


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.proj = torch.nn.Linear(32, 96)
        self.conv = torch.nn.Conv1d(8, 8, 3, padding=1, stride=1)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(self.norm(x)).view(2, 8, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = self.out(a.transpose(1, 2).reshape(2, 8, 32))
        return self.conv(h).relu().sum()


def _profiled(tmp_path: Path, model: torch.nn.Module, x: torch.Tensor) -> tuple:
    """The probe's window (raw records → wire → monitor) and the Chrome-trace window of one step."""
    model(x).sum().backward()  # warm up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        model(x).sum().backward()
    results = prof.profiler.kineto_results
    fields = records_from_kineto(results.events(), results.trace_start_ns())
    fields.update(window=1, step=0, device="cpu", step_dur_us=1.0, cost_s=0.0)
    probe_w = window_from_wire(_through_wire(fields))
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    return fields, probe_w, load_trace(tmp_path / "t.json")


def _assert_same_window(probe_w: object, chrome_w: object) -> None:
    assert probe_w.names == chrome_w.names and len(probe_w.events) == len(chrome_w.events)
    shift = probe_w.events[0].ts_us - chrome_w.events[0].ts_us  # different origins, same clock
    for a, b in zip(probe_w.events, chrome_w.events):
        assert (a.name, a.kind, a.stream, a.op, a.flops) == (b.name, b.kind, b.stream, b.op, b.flops)
        # the trace keeps ns as µs floats near 5e12 (1 ns steps): a few ns of rounding
        assert a.dur_us == pytest.approx(b.dur_us, abs=5e-3)
        assert a.ts_us - shift == pytest.approx(b.ts_us, abs=5e-3)


def test_probe_records_give_the_chrome_trace_window(tmp_path: Path) -> None:
    torch.manual_seed(0)
    fields, probe_w, chrome_w = _profiled(tmp_path, _Net(), torch.randn(2, 8, 32))
    _assert_same_window(probe_w, chrome_w)
    # shapes travel only for operators that may have a formula
    names = fields["names"]
    shaped = {names[o[0]] for o in fields["ops"] if o[5] is not None}
    assert {"aten::addmm", "aten::mm", "aten::convolution", "aten::linear"} <= shaped
    assert not shaped & {"aten::layer_norm", "aten::relu", "aten::sum", "aten::view", "aten::copy_"}
    flops = Counter()
    for e in probe_w.events:
        if e.kind == KERNEL and e.flops > 0:
            flops[probe_w.names[e.name]] += e.flops
    # conv forward lands on the MKLDNN call that does the work, below aten::_convolution
    assert set(flops) >= {"aten::addmm", "aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu",
                          "aten::_scaled_dot_product_flash_attention_for_cpu_backward", "aten::convolution_backward"}
    # 4·B·H·S²·D, halved: the call is causal and the fused kernel skips the masked half.
    assert flops["aten::_scaled_dot_product_flash_attention_for_cpu"] == 4 * 2 * 2 * 8 * 8 * 16 / 2
    assert flops["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == 2.5 * 4 * 2 * 2 * 8 * 8 * 16 / 2
    assert sum(1 for e in probe_w.events if e.kind == CPU_OP) >= 2


def test_exact_linear_flops_from_probe_records(tmp_path: Path) -> None:
    """Two Linear layers (bias: addmm forward) on a 32-row batch, through the probe's records."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 48))
    fields, probe_w, chrome_w = _profiled(tmp_path, model, torch.randn(32, 64))
    _assert_same_window(probe_w, chrome_w)
    stats = {k.name: k for k in aggregate(probe_w).kernels}
    # It failed rarely under CI's load with one mm's FLOPs missing (917,504 of 1,310,720), and never
    # in 300 tries alone or beside CPU hogs: the records of the matmuls say which one and why.
    names = fields["names"]
    detail = [(names[o[0]], o[1], round(o[2], 3), round(o[3], 3), o[5]) for o in fields["ops"]
              if names[o[0]] in ("aten::mm", "aten::addmm", "aten::linear")]
    # forward: 2·32·64·128 + 2·32·128·48; backward: grad input of layer 2 (32×48)·(48×128), grad
    # weights of both (128×32)·(32×64) and (48×32)·(32×128) — the input of layer 1 needs no grad
    assert stats["aten::addmm"].calls == 2
    assert stats["aten::addmm"].flops == 2 * 32 * 64 * 128 + 2 * 32 * 128 * 48, detail
    assert stats["aten::mm"].calls == 3
    assert stats["aten::mm"].flops == 2 * 32 * 48 * 128 + 2 * 128 * 32 * 64 + 2 * 48 * 32 * 128, detail
    assert {k for k, s in stats.items() if s.flops is not None} == {"aten::mm", "aten::addmm"}


def test_aligned_windows_fall_on_the_same_steps_on_every_rank() -> None:
    # Eight ranks of a synchronous job, noisy window costs: each rank's own arithmetic picks a
    # different interval, but aligned periods make their windows coincide.
    import random

    rng = random.Random(3)
    typical = 0.05
    taken: list[set[int]] = []
    for _ in range(8):
        s = WindowScheduler()
        steps: set[int] = set()
        for step in range(1, 3001):
            if s.due(step, step * typical):
                steps.add(step)
                s.record(step, step * typical, typical * rng.uniform(0.8, 1.2), typical)
        taken.append(steps)
    union = set().union(*taken)
    assert all(step % 16 == 0 for step in union)
    # The job pays for the distinct steps: no more than the busiest rank's windows.
    assert len(union) == max(len(t) for t in taken)
    # Each rank still keeps its own amortised cost in budget: ≤ 2 % of small steps.
    assert all(len(t) * typical * 1.2 / (3000 * typical) <= 0.02 + 1e-9 for t in taken)


def test_aligned_due_waits_for_a_multiple_of_the_period() -> None:
    s = WindowScheduler(min_interval_steps=10)
    assert not s.due(100, 0.0)  # anchors
    assert not s.due(110, 1.0) and s.due(112, 1.0)  # period 16 (10 rounded up)
    s.record(112, 1.0, 0.5, 0.01)  # ceil(0.5 / (0.02 × 0.01)) = 2500 steps → period 4096
    assert not s.due(2612, 2.0) and s.due(4096, 3.0)


def test_cpu_convolution_is_counted_once(tmp_path: Path) -> None:
    from flowtop.monitor.kernels.aggregate import aggregate

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3)
    x = torch.randn(2, 8, 16, 16)  # the input needs no gradient
    _, probe_w, _ = _profiled(tmp_path, conv, x)
    # Forward 2·B·Cout·Hout·Wout·Cin·k·k = 2·2·16·14·14·8·9; backward: weight gradient only, as much.
    forward = 2 * 2 * 16 * 14 * 14 * 8 * 9
    assert aggregate(probe_w).anatomy.flops == pytest.approx(2 * forward)


class _WithoutActivityType:
    """A Kineto event as torch ≤ 2.11 exposes it: everything but ``activity_type()``."""

    def __init__(self, event: object) -> None:
        self._e = event

    def __getattr__(self, name: str) -> object:
        if name == "activity_type":
            raise AttributeError(name)
        return getattr(self._e, name)


def test_records_without_activity_type_match_the_current_api() -> None:
    """torch 2.11 (the GPU machine's) has no ``activity_type()``: the compat rules give the same
    records for operators, and drop user annotations like the current API's category does."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        with torch.profiler.record_function("my_annotation"):
            model(x).sum().backward()
    results = prof.profiler.kineto_results
    events = results.events()
    if not hasattr(events[0], "activity_type"):
        pytest.skip("this torch has no activity_type(): the compat rules are the only path")
    current = records_from_kineto(events, results.trace_start_ns())
    compat = records_from_kineto([_WithoutActivityType(e) for e in events], results.trace_start_ns())
    assert compat == current
    assert "my_annotation" not in compat["names"] and "aten::addmm" in compat["names"]


class _Event:
    """A torch ≤ 2.11 Kineto event of a CUDA step (fake: this machine has no GPU)."""

    def __init__(self, name: str, device: object, linked: int, corr: int, resource: int = 7) -> None:
        self._args = (name, device, linked, corr, resource)

    def name(self) -> str:
        return self._args[0]

    def device_type(self) -> object:
        return self._args[1]

    def linked_correlation_id(self) -> int:
        return self._args[2]

    def correlation_id(self) -> int:
        return self._args[3]

    def device_resource_id(self) -> int:
        return self._args[4]

    def is_user_annotation(self) -> bool:
        return self._args[0].startswith("##")

    def start_ns(self) -> int:
        return 1_000_000 + 1000 * self._args[3]

    def end_ns(self) -> int:
        return self.start_ns() + 500

    def start_thread_id(self) -> int:
        return 1

    def shapes(self) -> list:
        return [[8, 16], [16, 32]]

    def concrete_inputs(self) -> list:
        return [None, None]


def test_compat_rules_classify_cuda_kernels_copies_and_runtime_calls() -> None:
    from torch._C._autograd import DeviceType

    cpu, cuda = DeviceType.CPU, DeviceType.CUDA
    events = [
        _Event("aten::mm", cpu, 0, 11),  # operator: External id 11
        _Event("##step##", cpu, 0, 12),  # user annotation: not a record
        _Event("cudaLaunchKernel", cpu, 11, 501),  # runtime call of op 11, CUPTI correlation 501
        _Event("nvjet_tst_128x64_64x4", cuda, 11, 501),  # its kernel
        _Event("Memcpy HtoD (Pageable -> Device)", cuda, 11, 502),
        _Event("Memset (Device)", cuda, 11, 503),
        _Event("##Optimizer.step#AdamW.step##", cuda, 12, 0),  # gpu_user_annotation: a range
        _Event("Command Buffer Full", cpu, 0, 0),  # CUPTI overhead record: no ids
        _Event("Activity Buffer Request", cpu, 0, 11),  # one with an id (H200, torch 2.11): not op 11
    ]
    rec = records_from_kineto(events, 1_000_000)
    names = rec["names"]
    assert [names[o[0]] for o in rec["ops"]] == ["aten::mm"]
    assert rec["ops"][0][4] == 11 and rec["ops"][0][5] == [[8, 16], [16, 32]]
    kinds = {names[a[0]]: (a[1], a[4], a[5], a[6]) for a in rec["acts"]}
    assert kinds == {
        "cudaLaunchKernel": (4, -1, 11, 501),  # RUNTIME, no stream
        "nvjet_tst_128x64_64x4": (0, 7, 11, 501),  # KERNEL on stream 7
        "Memcpy HtoD (Pageable -> Device)": (1, 7, 11, 502),
        "Memset (Device)": (2, 7, 11, 503),
    }


class _FakeProfile:
    """Stands in for torch.profiler.profile where the machine has no GPU to profile."""

    def __init__(self, activities: object, record_shapes: bool) -> None:
        self.activities = activities

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.mark.parametrize(("user", "cuda", "expected"), [
    (None, "13.0", "1"), ("0", "13.0", "0"), ("1", "13.0", "1"), (None, "12.6", "1"),
    (None, "12.4", None),  # CUDA graphs crash on CUPTI's re-init after a teardown before 12.6
])
def test_cuda_windows_detach_cupti_afterwards_unless_told_otherwise(
        monkeypatch: pytest.MonkeyPatch, user: str | None, cuda: str, expected: str | None) -> None:
    """Measured on an H200: with CUPTI left attached after a window, launch-bound steps ran
    1.33-1.36x slower for good. The probe asks Kineto to tear CUPTI down; a user's value wins."""
    monkeypatch.setenv("TEARDOWN_CUPTI", "placeholder")  # so monkeypatch restores the original
    if user is None:
        monkeypatch.delenv("TEARDOWN_CUPTI")
    else:
        monkeypatch.setenv("TEARDOWN_CUPTI", user)
    monkeypatch.setattr("torch.profiler.profile", _FakeProfile)
    monkeypatch.setattr("torch.version.cuda", cuda)
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1, min_request_s=0), cuda=True)
    sampler.request_now()
    assert sampler.begin_step(5)
    assert os.environ.get("TEARDOWN_CUPTI") == expected
    sampler.close()


def test_cupti_teardown_needs_cuda_12_6() -> None:
    from probe.kernels.windows import cupti_teardown_safe

    assert [cupti_teardown_safe(v) for v in ("12.6", "12.10", "13.0", "12.4", "11.8", None, "", "x")] == [
        True, True, True, False, False, False, False, False]


def test_cpu_windows_leave_cupti_settings_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEARDOWN_CUPTI", "placeholder")  # so monkeypatch restores the original
    monkeypatch.delenv("TEARDOWN_CUPTI")
    sampler = KernelWindowSampler(WindowScheduler(min_interval_steps=1, min_request_s=0), cuda=False)
    sampler.request_now()
    assert sampler.begin_step(5)
    sampler.end_step(5)
    assert "TEARDOWN_CUPTI" not in os.environ
