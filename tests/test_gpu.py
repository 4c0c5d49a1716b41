"""On a CUDA GPU: the code paths the CPU tests reach only through fakes.

Marked ``gpu``: skipped where torch sees no CUDA device (CI has none); run on the GPU machine with
``python -m pytest tests/test_gpu.py -p no:cacheprovider -s`` (``-s`` shows the measured figures,
which go into the issue notes). What each test pins:

- real NVML and GPM readings of the rank's own GPU under a bf16 GEMM load, and the
  ``CUDA_VISIBLE_DEVICES`` UUID (prefix) lookup;
- the FLOP counter on CUDA: every SDPA backend of a causal GPT step gives the hand formula
  (the same figures the CPU tests pin), bf16 autocast labelled;
- step timing by CUDA events with no synchronisation: a host loop that runs far ahead of the
  device still gets the device's step time;
- a real training subprocess on the GPU through a real collector: device name, MFU against the
  table's H200 peak, NVML/GPM telemetry, and a kernel window whose CUDA kernels are linked to
  their operators.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.gpu  # skipped by tests/conftest.py where torch sees no CUDA device


def _report(title: str, **figures: Any) -> None:
    """Measured figures on stdout (``-s``): they are the GPU run's evidence."""
    print(f"\n[gpu] {title}: " + ", ".join(f"{k}={v}" for k, v in figures.items()), flush=True)


def _gemm_load(seconds: float) -> int:
    """bf16 8192³ GEMMs for ``seconds`` (tensor pipes busy); returns the GEMM count."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(8):
            a @ b
        n += 8
        torch.cuda.synchronize()
    return n


# ---------------------------------------------------------------------------------- telemetry
def test_real_nvml_and_gpm_under_bf16_gemm_load() -> None:
    from probe.telemetry.nvml import DeviceTelemetry

    torch.cuda.init()
    tel = DeviceTelemetry(cuda_device_index=0)
    first = tel.sample()  # GPM baseline sample: no rates yet
    assert first["tensor_active"] is None and first["reasons"].get("tensor_active")
    _gemm_load(2.0)
    t0 = time.perf_counter()
    s = tel.sample()
    cost_ms = (time.perf_counter() - t0) * 1e3
    props = torch.cuda.get_device_properties(0)
    _report("nvml", **{k: s[k] for k in ("name", "gpu_util", "mem_used", "mem_total", "power_w",
                                         "power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz",
                                         "temp_c", "throttle", "sm_active", "sm_occupancy",
                                         "tensor_active", "tensor_hmma", "dram_bw_util",
                                         "nvlink_tx_bytes_s")},
            sample_ms=round(cost_ms, 2), reasons=s["reasons"])
    assert s["name"] == torch.cuda.get_device_name(0)
    if getattr(props, "uuid", None) is not None:
        assert s["uuid"].lower() == f"gpu-{props.uuid}".lower()
    assert abs(s["mem_total"] - props.total_memory) / props.total_memory < 0.05
    assert s["mem_used"] >= 2 * 8192 * 8192 * 2  # at least our two operands
    assert s["gpu_util"] >= 50  # busy for the whole last second
    assert 0 < s["power_w"] <= 1.1 * s["power_limit_w"]
    assert 0 < s["sm_clock_mhz"] <= s["sm_clock_max_mhz"]
    assert 5 < s["temp_c"] < 110
    assert isinstance(s["throttle"], list)
    assert cost_ms < 50, "a telemetry sample must stay cheap (it runs on the sender thread)"
    if torch.cuda.get_device_capability(0) >= (9, 0):  # Hopper: GPM must work
        for key in ("sm_active", "sm_occupancy", "tensor_active", "tensor_hmma", "dram_bw_util"):
            assert s[key] is not None, (key, s["reasons"].get(key))
            assert 0 <= s[key] <= 100.5, (key, s[key])
        assert s["sm_active"] > 50 and s["tensor_active"] > 10 and s["tensor_hmma"] > 10
    tel.close()
    closed = tel.sample()
    assert closed["gpu_util"] is None and closed["reasons"]["gpu_util"] == "telemetry closed"


def test_cuda_visible_devices_uuid_prefix_resolves_the_same_gpu() -> None:
    from probe.telemetry.nvml import DeviceTelemetry

    whole = DeviceTelemetry(cuda_device_index=0).sample()
    uuid = whole["uuid"]
    assert uuid and uuid.startswith("GPU-")
    for visible in (uuid, uuid[:12], "0"):  # CUDA accepts a unique prefix; NVML does not
        s = DeviceTelemetry(cuda_device_index=0, env={"CUDA_VISIBLE_DEVICES": visible}).sample()
        assert s["uuid"] == uuid, (visible, s["reasons"])
    missing = DeviceTelemetry(cuda_device_index=0, env={"CUDA_VISIBLE_DEVICES": "GPU-ffffffff"}).sample()
    assert missing["gpu_util"] is None and "UUID" in missing["reasons"]["gpu_util"]


# ---------------------------------------------------------------------------------- FLOPs
# flowtop.tools.demo.train's GPT (vocab 2048, 4 heads) at these sizes; head dim 64 suits every backend
B, T, D, H, L, V = 4, 256, 256, 4, 2, 2048
N = B * T
LINEARS = 24 * N * D * D  # per block: 2·N·(3d² + d² + 4d² + 4d²), biases not counted
HEAD = 2 * N * D * V
ATTN = 4 * B * T * T * D  # per block, full square (scores + weighted sum)
MODEL = 3 * (L * LINEARS + HEAD) + 3 * L * ATTN  # every matmul needs input and weight grads
# what the fused kernels ran: the backward recomputes the scores (2.5 × forward), and causal
# kernels skip the masked half whatever the convention (MODEL counts the whole square)
EXECUTED = 3 * (L * LINEARS + HEAD) + L * (ATTN + 5 * ATTN // 2) // 2


def _gpt_step(device: str, dtype: str) -> tuple[Any, Any]:
    from flowtop.tools.demo.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=V, n_layer=L, n_head=H, n_embd=D, block_size=T)).to(device)
    idx = torch.randint(0, V, (B, T), device=device)

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            _, loss = model(idx, idx)
        loss.backward()

    return model, step


@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"])
def test_gpt_step_flops_on_cuda_match_the_hand_formula(backend: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flop_helpers import count

    model, step = _gpt_step("cuda", "bf16")
    step()  # warm-up outside the window (cuBLAS/cuDNN handles)
    try:
        with sdpa_kernel([getattr(SDPBackend, backend)]):
            step()
            result = count(step, root=model)
    except RuntimeError as exc:
        if "No available kernel" in str(exc):
            pytest.skip(f"{backend} not available for these shapes on this GPU: {exc}")
        raise
    torch.cuda.synchronize()
    _report(f"flops {backend}", model=result.model_flops, executed=result.executed_flops,
            dtype=result.dtype, ops=sorted(result.by_op), uncounted=dict(result.uncounted))
    assert result.model_flops == MODEL
    assert result.dtype == "bf16"
    if backend == "MATH":  # bmm ops, no recompute in backward
        assert result.executed_flops == MODEL
    else:  # the fused backward recomputes the scores (2.5 × forward) over half the square
        assert result.executed_flops == EXECUTED
        assert not any("bmm" in op for op in result.by_op), result.by_op


# ---------------------------------------------------------------------------------- step timing
def test_cuda_events_give_device_step_time_while_the_host_runs_ahead(monitor) -> None:
    """The probe never synchronises: the host enqueues 40 steps of ~20 ms device work in far less
    than 40 × 20 ms, and the step messages still carry each step's device time."""
    import probe

    model = torch.nn.Linear(16, 16, device="cuda")
    x = torch.randn(4, 16, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    # Calibrate torch.cuda._sleep to about 20 ms of device time.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    for _ in range(3):
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        cycles = int(cycles * 20.0 / max(start.elapsed_time(end), 0.1))
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    expected_s = start.elapsed_time(end) / 1e3

    def step() -> None:
        torch.cuda._sleep(cycles)
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    os.environ.update(FLOWTOP_FLOPS="0", FLOWTOP_KERNELS="0", FLOWTOP_TELEMETRY="0")
    try:
        assert probe.attach(addr=monitor.listen, job="gpu-events")
        step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(40):
            step()
        host_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        step()  # one more boundary: the last timed steps' events are complete by now
        step()
        snap = monitor.wait_for(lambda s: bool(s.jobs) and s.jobs[0].ranks[0].step >= 43, 20)
    finally:
        probe.detach()
        for key in ("FLOWTOP_FLOPS", "FLOWTOP_KERNELS", "FLOWTOP_TELEMETRY"):
            os.environ.pop(key, None)
    rank = snap.jobs[0].ranks[0]
    _report("cuda events", expected_step_ms=round(expected_s * 1e3, 2), host_loop_ms=round(host_s * 1e3, 1),
            device_time_ms=rank.device_time_s and round(rank.device_time_s * 1e3, 2))
    assert host_s < 0.5 * 40 * expected_s, "the host waited for the device: something synchronised"
    assert rank.device_time_s is not None
    assert abs(rank.device_time_s - expected_s) / expected_s < 0.25


# ---------------------------------------------------------------------------------- end to end
def test_whole_network_cuda_graph_capture_under_the_probe(monitor) -> None:
    """Forward, backward and a capturable Adam step captured in one CUDA graph with the probe
    attached (every feature): the boundary inside the capture records and queries no event (one
    there would belong to the graph, a query can invalidate the capture), the replays train, and
    eager steps after it get their device time again (2026-12-04 on an H200: 50 replays, loss
    moved, device time back on the eager steps)."""
    import probe

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    x, y = torch.randn(64, 512, device="cuda"), torch.randn(64, 512, device="cuda")

    def eager_step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()

    try:
        assert probe.attach(addr=monitor.listen, job="gpu-capture")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as capture asks
            for _ in range(5):
                eager_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        first = loss.item()
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        after = loss.item()
        tracker = probe._current().tracker
        for _ in range(10):
            eager_step()
        torch.cuda.synchronize()
        eager_step()
        seconds, step = tracker._device_time()
    finally:
        probe.detach()
    _report("graph capture", loss_first=round(first, 5), loss_after=round(after, 5), device_s=seconds, step=step)
    assert after < first  # the captured step trains
    assert tracker._clock is not None and seconds is not None and 0 < seconds < 1.0


def test_cuda_training_through_a_real_collector(monitor) -> None:
    from conftest import probed_env

    env = probed_env(monitor.listen, FLOWTOP_KERNELS_MIN_STEPS="8", FLOWTOP_JOB="gpu-e2e")
    cmd = [sys.executable, "-m", "flowtop.tools.demo.train", "--device", "cuda", "--dtype", "bf16",
           "--steps", "100000", "--layers", str(L), "--width", str(D), "--seq", str(T),
           "--batch", str(B)]
    proc = subprocess.Popen(cmd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()

    def ready(s: Any) -> bool:
        if not s.jobs:
            return False
        r = s.jobs[0].ranks[0]
        tel = r.telemetry.device if r.telemetry else {}
        return (r.flops is not None and r.flops.mfu is not None and r.kernels is not None
                and r.device_time_s is not None and tel.get("tensor_active") is not None)

    try:
        snap = monitor.wait_for(ready, 120)
    finally:
        proc.terminate()
        proc.wait(30)
    assert snap.jobs, "".join(stderr)[-3000:]
    job = snap.jobs[0]
    r = job.ranks[0]
    f, tel, k = r.flops, (r.telemetry.device if r.telemetry else {}), r.kernels
    _report("e2e", device=r.device, step_ms=r.step_time_s and round(r.step_time_s * 1e3, 2),
            device_ms=r.device_time_s and round(r.device_time_s * 1e3, 2),
            mfu=f and f.mfu, hfu=f and f.hfu, peak=f and f.peak_flops, peak_source=f and f.peak_source,
            dtype=f and f.dtype, gpu_util=tel.get("gpu_util"), tensor_active=tel.get("tensor_active"),
            sm_active=tel.get("sm_active"), power_w=tel.get("power_w"),
            kernels=k and len(k.kernels), busy=k and k.anatomy.busy_frac,
            busy_typical=k and k.anatomy.busy_frac_typical, window_flops=k and k.anatomy.flops,
            top=k and [(x.short, x.category, round(x.total_us, 1), x.op) for x in k.kernels[:6]],
            hints=[h.id for h in job.hints], probe_overhead=r.probe_overhead_frac)
    assert ready(snap), "".join(stderr)[-3000:]
    assert r.device == torch.cuda.get_device_name(0)
    assert f.model_flops_per_step == MODEL and f.executed_flops_per_step == EXECUTED
    assert f.dtype == "bf16"
    from probe.flops.peaks import lookup_peak

    table, _ = lookup_peak(r.device, "bf16")  # the monitor's peak is the table's row for this GPU
    if table is not None:
        assert f.peak_flops == table.flops and table.source in f.peak_source, f.peak_source
    assert 0 < f.mfu < 1 and 0 < f.hfu < 1
    # device time (CUDA events, the latest complete step, maybe a sampled one) is a step's time
    assert 0 < r.device_time_s < 5 * r.step_time_s
    assert tel["gpu_util"] is not None and tel["sm_clock_mhz"] and tel["power_w"]
    assert k.device == "cuda"
    # record_function ranges reach the device as annotations, CUPTI adds overhead records:
    # neither is a kernel nor an operator (torch 2.11 exposes no activity_type() to tell them)
    assert not [x.name for x in k.kernels if x.name.startswith("Optimizer.")], [x.name for x in k.kernels]
    assert not [x.op for x in k.kernels if x.op and not x.op.startswith("aten::")]
    cats = {c.category for c in k.categories}
    assert "gemm" in cats and "attention" in cats, cats
    linked = [x for x in k.kernels if x.op]
    assert len(linked) >= 0.9 * len(k.kernels), [x.name for x in k.kernels if not x.op][:10]
    # kernel FLOPs come from the operators' shapes: every GEMM of the step is attributed; the
    # causal attention kernels count half the square (what they execute), as the counter's executed FLOPs do
    assert k.anatomy.flops is not None
    expected = EXECUTED
    assert abs(k.anatomy.flops - expected) / expected < 0.02, (k.anatomy.flops, expected)
    assert 0 < k.anatomy.busy_frac <= 1
