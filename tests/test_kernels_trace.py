"""Chrome-trace loader, the compact window, and the window built from a probe's raw records (monitor side)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from flowtop.monitor.kernels.chrome import load_trace, window_from_chrome
from flowtop.monitor.kernels.trace import CPU_OP, KERNEL, MEMCPY, MEMSET, RUNTIME, TraceError, window_from_wire
from flowtop.monitor.recording import feed
from flowtop.monitor.wiring import make_model
from probe import wire
from probe.kernels.records import records_from_kineto

FIXTURE = Path(__file__).parent / "data" / "h200-gpt-small-step.trace.json.gz"


@pytest.fixture(scope="module")
def h200() -> Any:
    return load_trace(FIXTURE)


def _of(w: Any, kind: int) -> list:
    return [e for e in w.events if e.kind == kind]


def test_h200_events_by_kind(h200: Any) -> None:
    assert h200.device == "cuda"
    assert Counter(e.kind for e in h200.events) == {KERNEL: 200, MEMSET: 8, RUNTIME: 247, CPU_OP: 418}
    assert sum(e.dur_us for e in _of(h200, KERNEL)) == pytest.approx(884.4111328125, abs=1e-9)
    assert sum(e.dur_us for e in _of(h200, MEMSET)) == pytest.approx(6.3994140625, abs=1e-9)
    # the step is the extent of the kept events (no ProfilerStep annotation in this trace)
    assert h200.step_dur_us == pytest.approx(12995.2958984375, abs=1e-9)
    assert min(e.ts_us for e in h200.events) == 0.0


def test_h200_annotations_are_not_kernels(h200: Any) -> None:
    # "Optimizer.step#AdamW.step" exists as gpu_user_annotation (208 µs) and user_annotation
    assert not [n for n in h200.names if n.startswith("Optimizer.")]


def test_h200_attribution_and_flops(h200: Any) -> None:
    names = h200.names
    by_op: Counter[str] = Counter()
    for e in _of(h200, KERNEL):
        by_op[names[e.op]] += 1
        kernel = names[e.name]
        if "sdpa_sm90_flash_fprop" in kernel:  # linked to _cudnn_attention_forward, which has no formula
            assert names[e.op] == "aten::_scaled_dot_product_cudnn_attention"
            assert e.flops == 4 * 4 * 4 * 256 * 256 * 64 / 2  # is_causal: the kernel skips half
        elif "sdpa_sm90_flash_bprop" in kernel:
            assert names[e.op] == "aten::_scaled_dot_product_cudnn_attention_backward"
            assert e.flops == 2.5 * 4 * 4 * 4 * 256 * 256 * 64 / 2
        elif "compute_dot_do_o" in kernel or "convert_dq" in kernel or "splitKreduce" in kernel:
            assert e.flops == -1.0  # the op's FLOPs went to its longest kernel
        elif kernel.startswith("nvjet"):
            assert names[e.op] == "aten::mm" and e.flops > 0
    assert by_op["aten::mm"] == 52 and by_op["aten::copy_"] == 66
    assert by_op["aten::_scaled_dot_product_cudnn_attention_backward"] == 12
    # 6·N·tokens for the 5.24 M matmul parameters + executed attention (backward 2.5 ×, causal:
    # half the square): 35,970,351,104 with full-square attention, less half of 4 layers' attention.
    attention = 4 * (4 * 4 * 4 * 256 * 256 * 64) * (1 + 2.5)
    assert sum(e.flops for e in h200.events if e.kind == KERNEL and e.flops > 0) == 35_970_351_104 - attention / 2


def test_h200_runtime_links(h200: Any) -> None:
    linked = [e for e in _of(h200, RUNTIME) if e.op >= 0]
    assert len(linked) == 208  # every kernel and memset has its launch call
    for r in linked:
        target = h200.events[r.op]
        assert target.kind in (KERNEL, MEMSET) and target.ts_us >= r.ts_us
    assert {h200.names[r.name] for r in linked} == {
        "cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC", "cudaMemsetAsync"}


def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_synthetic_cuda_step() -> None:
    ev = [
        _x("user_annotation", "ProfilerStep#5", 100, 1000),
        _x("cpu_op", "aten::linear", 110, 190, **{"External id": 1, "Input Dims": [[4, 8], [16, 8], [16]]}),
        _x("cpu_op", "aten::t", 120, 10, **{"External id": 2}),
        _x("cuda_runtime", "cudaLaunchKernel", 140, 20, **{"External id": 1, "correlation": 11}),
        _x("kernel", "custom_linear_kernel", 170, 7, tid=7, stream=7, correlation=11, **{"External id": 1}),
        _x("cpu_op", "aten::mm", 310, 190, **{"External id": 3, "Input Dims": [[32, 64], [64, 16]]}),
        _x("cuda_runtime", "cudaLaunchKernel", 320, 5, **{"External id": 3, "correlation": 12}),
        _x("cuda_runtime", "cudaLaunchKernel", 330, 5, **{"External id": 3, "correlation": 13}),
        _x("kernel", "gemm_splitK", 340, 50, tid=7, stream=7, correlation=12),  # linked via its runtime call
        _x("kernel", "splitKreduce_kernel", 390, 5, tid=7, stream=7, correlation=13, **{"External id": 3}),
        _x("cpu_op", "aten::_scaled_dot_product_cudnn_attention", 510, 190,
           **{"External id": 4, "Input Dims": [[1, 2, 8, 4]] * 3}),
        _x("cpu_op", "aten::_cudnn_attention_forward", 520, 100, **{"External id": 5}),
        _x("kernel", "sdpa_fprop_kernel", 600, 30, tid=8, stream=8, correlation=14, **{"External id": 5}),
        _x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 650, 10, tid=8, stream=8, correlation=15),
        _x("gpu_user_annotation", "Optimizer.step#AdamW.step", 600, 200, tid=7),
        _x("user_annotation", "Optimizer.step#AdamW.step", 700, 50),
        _x("cpu_op", "aten::add", 2000, 10, **{"External id": 9}),  # after the step: dropped
    ]
    w = window_from_chrome({"traceEvents": ev, "deviceProperties": [{"name": "NVIDIA H200"}]})
    assert w.device == "cuda" and w.step_dur_us == 1000
    rows = [(w.names[e.name], e.kind, e.ts_us, e.dur_us, e.stream,
             (e.op if e.kind == RUNTIME else (w.names[e.op] if e.op >= 0 else None)), e.flops) for e in w.events]
    assert rows == [
        ("aten::linear", CPU_OP, 10, 190, -1, None, 2 * 4 * 16 * 8),  # no mm below it: counts itself
        ("cudaLaunchKernel", RUNTIME, 40, 20, -1, 2, -1),
        ("custom_linear_kernel", KERNEL, 70, 7, 7, "aten::linear", 2 * 4 * 16 * 8),
        ("aten::mm", CPU_OP, 210, 190, -1, None, 2 * 32 * 64 * 16),
        ("cudaLaunchKernel", RUNTIME, 220, 5, -1, 6, -1),
        ("cudaLaunchKernel", RUNTIME, 230, 5, -1, 7, -1),
        ("gemm_splitK", KERNEL, 240, 50, 7, "aten::mm", 2 * 32 * 64 * 16),
        ("splitKreduce_kernel", KERNEL, 290, 5, 7, "aten::mm", -1),
        ("aten::_scaled_dot_product_cudnn_attention", CPU_OP, 410, 190, -1, None, 4 * 2 * 8 * 8 * 4),
        ("sdpa_fprop_kernel", KERNEL, 500, 30, 8, "aten::_scaled_dot_product_cudnn_attention", 4 * 2 * 8 * 8 * 4),
        ("Memcpy DtoD (Device -> Device)", MEMCPY, 550, 10, 8, None, -1),
    ]


def test_synthetic_cpu_step_uses_exclusive_time() -> None:
    ev = [
        _x("cpu_op", "aten::linear", 0, 100, **{"External id": 1, "Input Dims": [[32, 64], [128, 64], [128]]}),
        _x("cpu_op", "aten::addmm", 10, 80, **{"External id": 2, "Input Dims": [[128], [32, 64], [64, 128], [], []]}),
        _x("cpu_op", "aten::copy_", 20, 10, **{"External id": 3}),
        _x("cpu_op", "aten::relu", 150, 10, **{"External id": 4}),
    ]
    w = window_from_chrome({"traceEvents": ev})
    assert w.device == "cpu" and w.step_dur_us == 160
    rows = [(w.names[e.name], e.kind, e.ts_us, e.dur_us, w.names[e.op] if e.op >= 0 else None, e.flops) for e in w.events]
    mm = 2 * 32 * 64 * 128
    assert rows == [
        ("aten::linear", KERNEL, 0, 20, "aten::linear", -1),  # composite with addmm below: no FLOPs
        ("aten::linear", CPU_OP, 0, 100, None, -1),
        ("aten::addmm", KERNEL, 10, 70, "aten::addmm", mm),
        ("aten::copy_", KERNEL, 20, 10, "aten::addmm", -1),  # runs inside addmm: attributed to it
        ("aten::relu", KERNEL, 150, 10, "aten::relu", -1),
        ("aten::relu", CPU_OP, 150, 10, None, -1),
    ]


@pytest.mark.parametrize(("content", "message"), [
    (b"{", "cannot read"),
    (b"[1, 2]", "not a Chrome trace"),
    (b'{"traceEvents": 3}', "no traceEvents"),
    (b'{"traceEvents": []}', "no operator or kernel events"),
    (gzip.compress(b'{"traceEvents": [}'), "cannot read"),
])
def test_invalid_files(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=message):
        load_trace(p)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "absent.json.gz")


def test_plain_json_equals_gzip(tmp_path: Path, h200: Any) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(gzip.decompress(FIXTURE.read_bytes()))
    assert load_trace(p) == h200


def test_monitor_side_imports_no_torch() -> None:
    code = ("import sys, flowtop.monitor.kernels.aggregate, flowtop.monitor.kernels.trace, flowtop.tools.analyze; "
            "bad = [m for m in ('torch', 'textual') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


class _FakeKinetoEvent:
    """The accessors of torch's ``_KinetoEvent`` that the probe reads, fed from a Chrome event.

    In the profiler API an operator's ``correlation_id()`` is its External id; a kernel's or a
    runtime call's ``correlation_id()`` is the CUPTI correlation and ``linked_correlation_id()``
    the External id of its operator; ``device_resource_id()`` is the stream.
    """

    def __init__(self, e: dict[str, Any]) -> None:
        from flowtop.monitor.kernels.opflops import parse_concrete

        self.e, args = e, e.get("args", {})
        self._start = round(e["ts"] * 1000)
        self._end = self._start + round(e["dur"] * 1000)
        op = e["cat"] == "cpu_op"
        self._corr = args.get("External id", 0) if op else args.get("correlation", 0)
        self._linked = 0 if op else args.get("External id", 0)
        self._concrete = [parse_concrete(v) for v in args.get("Concrete Inputs", [])]
        self._args = args

    def activity_type(self) -> str: return self.e["cat"]
    def name(self) -> str: return self.e["name"]
    def start_ns(self) -> int: return self._start
    def end_ns(self) -> int: return self._end
    def start_thread_id(self) -> int: return self.e["tid"]
    def correlation_id(self) -> int: return self._corr
    def linked_correlation_id(self) -> int: return self._linked
    def device_resource_id(self) -> int: return self._args.get("stream", self.e["tid"])
    def shapes(self) -> list: return self._args.get("Input Dims", [])
    def concrete_inputs(self) -> list: return self._concrete


KEY = wire.RankKey("j", "h", 1, 0, 0)


@pytest.fixture(scope="module")
def h200_fields(h200: Any) -> dict[str, Any]:
    """The probe's raw records of the H200 step (its kineto path, GPU kinds included), as sent."""
    raw = json.loads(gzip.decompress(FIXTURE.read_bytes()))["traceEvents"]
    events = [_FakeKinetoEvent(e) for e in raw if e.get("ph") == "X" and "dur" in e]
    t0 = min(ev._start for ev in events if ev.e["cat"] in ("cpu_op", "kernel", "gpu_memset", "cuda_runtime", "cuda_driver"))
    fields = records_from_kineto(events, t0)
    fields.update(window=3, step=40, device="cuda", step_dur_us=h200.step_dur_us, cost_s=0.01, typical_step_us=6800.0)
    return dict(wire.decode(wire.encode("kernels", KEY, 1, 1.0, fields)).fields)


def test_probe_records_through_the_wire_give_the_chrome_window(h200: Any, h200_fields: dict[str, Any]) -> None:
    """Raw records → wire → monitor builds the same window as the Chrome loader, GPU kinds included."""
    w = window_from_wire(h200_fields)
    assert (w.step, w.window, w.cost_s, w.typical_step_us, w.device) == (40, 3, 0.01, 6800.0, "cuda")
    assert w.step_dur_us == h200.step_dur_us
    assert w.names == h200.names and len(w.events) == len(h200.events)
    for a, b in zip(w.events, h200.events):
        assert (a.name, a.kind, a.stream, a.op, a.flops) == (b.name, b.kind, b.stream, b.op, b.flops)
        assert a.ts_us == pytest.approx(b.ts_us, abs=2e-3) and a.dur_us == pytest.approx(b.dur_us, abs=2e-3)
    # what was sent: every kept record, shapes only for operators that may have a formula
    ops, acts = h200_fields["ops"], h200_fields["acts"]
    assert Counter(a[1] for a in acts) == {KERNEL: 200, MEMSET: 8, RUNTIME: 247}
    shaped = Counter(h200_fields["names"][o[0]] for o in ops if o[5] is not None)
    assert shaped["aten::mm"] == 51 and shaped["aten::linear"] == 34 and "aten::copy_" not in shaped


def _bad_name(records: list, i: int) -> None:
    records[i] = [10_000, *records[i][1:]]


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda f: _bad_name(f["ops"], 5), "op 5: name index 10000 out of range"),
    (lambda f: _bad_name(f["acts"], 0), "activity 0: name index 10000 out of range"),
    (lambda f: f["ops"][0].__setitem__(0, -1), "op 0: name index -1 out of range"),  # never read from the end
    (lambda f: f["acts"][0].__setitem__(1, 3), "unknown kind 3"),  # host ops are not activities
    (lambda f: f["acts"][0].__setitem__(1, True), "unknown kind True"),
    (lambda f: f["ops"][0].__setitem__(1, [1]), "thread and ext must be integers"),  # unhashable thread
    (lambda f: f["ops"][0].__setitem__(2, float("nan")), "not a finite number"),
    (lambda f: f["ops"].append([0, 0, 1.0]), "not a list of 7 fields"),
    (lambda f: f["acts"].append(None), "not a list of 7 fields"),
    (lambda f: f.__setitem__("names", [1, 2]), "names is not a list of strings"),
    (lambda f: f.__setitem__("device", "tpu"), "unknown device"),
    (lambda f: f.pop("device"), "device"),
    (lambda f: f.pop("ops"), "ops"),
])
def test_window_from_wire_rejects_inconsistent_records(h200_fields: dict[str, Any], mutate: Any, reason: str) -> None:
    fields = {k: ([list(r) for r in v] if k in ("ops", "acts") else v) for k, v in h200_fields.items()}
    mutate(fields)
    with pytest.raises(TraceError, match="malformed kernel window") as err:
        window_from_wire(fields)
    assert reason in str(err.value)


def test_inconsistent_window_becomes_a_rejected_message() -> None:
    """Valid on the wire, inconsistent for the monitor: counted as rejected, the monitor goes on."""
    model = make_model()
    fields = {"window": 1, "step": 5, "device": "cpu", "step_dur_us": 10.0, "names": ["aten::mm"],
              "ops": [[0, 1, 0.0, 5.0, 1, [[2, 3], [3, 4]], None], [1, 1, 6.0, 8.0, 2, None, None]], "acts": []}
    feed(model, wire.encode("kernels", KEY, 0, 1.0, fields), 1.0)
    assert model.rejected == 1
    (reason,) = model.rejected_reasons  # its kind (numbers left out), and in the notice its text
    assert "TraceError" in reason and "op #: name index # out of range" in reason
    (notice,) = model.notices.take()
    assert "op 1: name index 1 out of range" in notice.text
    fields["names"].append("aten::relu")  # now consistent: accepted and aggregated
    feed(model, wire.encode("kernels", KEY, 1, 2.0, fields), 2.0)
    assert model.rejected == 1
    stats = model.snapshot(3.0, "test").jobs[0].ranks[0].kernels
    assert {k.name: k.flops for k in stats.kernels} == {"aten::mm": 2 * 2 * 3 * 4, "aten::relu": None}


def test_wire_valid_garbage_never_crashes_the_builder() -> None:
    """Records that pass the wire's checks but make no sense give a window or a TraceError."""
    import random

    rng = random.Random(7)
    names = ["aten::mm", "aten::linear", "aten::convolution", "aten::_scaled_dot_product_cudnn_attention",
             "cudaLaunchKernel", "k"]
    outcomes: Counter[str] = Counter()
    for _ in range(200):
        def dims() -> list | None:
            return rng.choice([None, [], [[rng.randrange(0, 2**62) for _ in range(rng.randrange(0, 9))]
                                          for _ in range(rng.randrange(0, 17))]])

        def concrete() -> list | None:
            pool = [None, True, 0, -1, 2**63 - 1, 0.5, "", "x", [0, 0], [], [True, False]]
            return rng.choice([None, [rng.choice(pool) for _ in range(rng.randrange(0, 17))]])

        n = len(names) - rng.choice([0, 0, 0, 2])  # sometimes indices point past the table
        ops = [[rng.randrange(len(names)), rng.randrange(3), rng.uniform(-10, 50), rng.uniform(-10, 50), rng.randrange(4),
                dims(), concrete()] for _ in range(rng.randrange(0, 30))]
        acts = [[rng.randrange(len(names)), rng.choice([0, 1, 2, 4]), rng.uniform(0, 50), rng.uniform(0, 50),
                 rng.randrange(-1, 3), rng.randrange(4), rng.randrange(4)] for _ in range(rng.randrange(0, 30))]
        fields = {"window": 1, "step": 1, "device": rng.choice(["cpu", "cuda"]), "step_dur_us": 50.0,
                  "names": names[:n], "ops": ops, "acts": acts}
        fields = dict(wire.decode(wire.encode("kernels", KEY, 0, 1.0, fields)).fields)  # wire-valid
        try:
            w = window_from_wire(fields)
        except TraceError:
            outcomes["rejected"] += 1
            continue
        outcomes["built"] += 1
        assert all(e.flops == -1.0 or 0 <= e.flops < float("inf") for e in w.events)
    assert outcomes["built"] > 100 and outcomes["rejected"] > 10


class _Torch211Event(_FakeKinetoEvent):
    """The same event as torch 2.11 exposes it: no ``activity_type()``; a device type, a user
    annotation flag, and no correlation at all on CUPTI's overhead records."""

    _DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")

    def __getattribute__(self, name: str) -> Any:
        if name == "activity_type":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def device_type(self) -> Any:
        from torch._C._autograd import DeviceType

        return DeviceType.CUDA if self.e["cat"] in self._DEVICE_CATS else DeviceType.CPU

    def is_user_annotation(self) -> bool:
        return self.e["cat"] in ("user_annotation", "gpu_user_annotation")


def test_torch_211_events_of_the_h200_step_give_the_same_records(h200: Any) -> None:
    """The compat rules (torch ≤ 2.11 has no activity_type()) on the H200 GPU step's events: the
    same records as the category API — kernels, memsets, runtime and driver calls; annotations
    (host and device) and CUPTI's overhead record dropped — and a CUDA call made outside any
    operator stays a runtime call, never an operator (it has no External id to offer)."""
    pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train]); the monitor-only install has none")
    raw = json.loads(gzip.decompress(FIXTURE.read_bytes()))["traceEvents"]
    raw = [e for e in raw if e.get("ph") == "X" and "dur" in e]
    unlinked = {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "tid": raw[0]["tid"],
                "ts": raw[-1]["ts"], "dur": 5.0, "args": {"correlation": 999_999}}
    current = [_FakeKinetoEvent(e) for e in raw + [unlinked]]
    compat = [_Torch211Event(e) for e in raw + [unlinked]]
    t0 = min(ev._start for ev in current)
    a, b = records_from_kineto(current, t0), records_from_kineto(compat, t0)
    assert a == b
    names = b["names"]
    assert "cudaDeviceSynchronize" not in {names[o[0]] for o in b["ops"]}
    assert [x for x in b["acts"] if names[x[0]] == "cudaDeviceSynchronize"][0][1] == RUNTIME
    assert not any(names[x[0]].startswith("Optimizer.") for x in b["acts"])


def test_runtime_call_names() -> None:
    for name in ("cudaLaunchKernel", "cudaEventQuery", "cuLaunchKernelEx", "cuModuleLoadData", "INVALID"):
        assert wire.is_runtime_call(name), name
    for name in ("aten::mm", "cudnn_convolution", "cutlass_kernel", "custom_op", "cu", "Optimizer.step#AdamW.step"):
        assert not wire.is_runtime_call(name), name


def test_monitor_drops_runtime_calls_sent_as_operators() -> None:
    """Recordings from probes on torch 2.11 before the fix carry "cudaStreamIsCapturing" as an
    operator whose CUPTI correlation id equals a real operator's External id; the monitor must
    keep the kernel on the real operator."""
    names = ["aten::native_layer_norm", "cudaStreamIsCapturing", "vectorized_layer_norm_kernel", "cudaLaunchKernel"]
    fields = {"window": 1, "step": 1, "device": "cuda", "step_dur_us": 100.0, "names": names,
              "ops": [[0, 1, 0.0, 20.0, 5228, None, None], [1, 1, 30.0, 31.0, 5228, None, None]],
              "acts": [[3, 4, 5.0, 8.0, -1, 5228, 77], [2, 0, 10.0, 40.0, 7, 5228, 77]]}
    w = window_from_wire(dict(wire.decode(wire.encode("kernels", KEY, 0, 1.0, fields)).fields))
    (kernel,) = [e for e in w.events if e.kind == KERNEL]
    assert w.names[kernel.op] == "aten::native_layer_norm"
    assert "cudaStreamIsCapturing" not in {w.names[e.name] for e in w.events if e.kind == CPU_OP}


def test_a_cpu_matmul_keeps_its_flops_when_a_child_op_ran_longer() -> None:
    """On the CPU a matmul's arithmetic is its own body: a child op (aten::empty here) that was
    preempted for 80 of the mm's 100 µs must not take its FLOPs (it failed CI that way once: one
    mm's FLOPs showed on another row). 2·32·48·128 = 393,216 FLOPs, all on the aten::mm row."""
    from flowtop.monitor.kernels.aggregate import aggregate
    from flowtop.monitor.kernels.trace import OpRecord, build_window

    mm = OpRecord("aten::mm", 1, 0.0, 100.0, 7, [[32, 48], [48, 128]], None)
    empty = OpRecord("aten::empty", 1, 10.0, 90.0, 8, None, None)
    stats = {k.name: k for k in aggregate(build_window([mm, empty], [], origin=0.0, step_dur_us=100.0,
                                                       device="cpu")).kernels}
    assert stats["aten::mm"].flops == 2 * 32 * 48 * 128
    assert stats["aten::empty"].flops is None
