#!/usr/bin/env bash
# Every GPU check of issue 5 in one command, for one short lease of a GPU machine.
#
#   bash bench/device_run.sh            # results under $OUT (default /tmp/flowtop-gpu)
#   STAGES="pytest gpu_check" bash bench/device_run.sh    # some stages only
#
# The machine has torch, nvidia-ml-py, psutil and msgpack but no pyzmq: wheels in .whl/ (see
# README "Benchmarks") are installed into /tmp/site first. Each stage has its own time limit and
# writes its own file, so a stage that hangs or fails still leaves the others' figures:
#   run.log          this script's log (versions, nvidia-smi, stage timings, stderr of every stage)
#   pytest_gpu.log   tests/test_gpu.py with -s: the real NVML/GPM, CUDA FLOP, event and e2e tests
#   gpu_check.json   bench/gpu_check.py (small and large GPT, probe vs no probe, monitor's view)
#   teardown.json    bench/cupti_teardown.py: steps after a profiler window, TEARDOWN_CUPTI unset/1
#   costs.json       bench/probe_costs.py: the probe's training-thread time per step, by feature
#                    (COSTS_ARGS="--hooks" adds every hook timed from outside)
#   overhead.json    bench/overhead.py --device cuda, mid-size and small GPT (A/B blocks)
#   calibrate.txt    flowtop calibrate: ncu hardware FLOPs vs the probe's executed FLOPs
#   moe_fp8.json     bench/gpu_moe_fp8.py: bf16 vs fp8 GEMM MFU per dtype, grouped-GEMM MoE step,
#                    _scaled_grouped_mm and varlen attention counts vs hand and FlopCounterMode
#   small.rec.gz, large.rec.gz   the monitor's recordings of gpu_check (flowtop replay FILE)
set -u
OUT=${OUT:-/tmp/flowtop-gpu}
mkdir -p "$OUT/rec"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1
T0=$(date +%s)
stage() { echo "=== $1 (t=$(( $(date +%s) - T0 )) s)"; }
# A stage runs if STAGES names it (all by default) and its own limit still fits in the run's
# budget (the device tool allows 600 s a command): a late stage is skipped, never cut off.
BUDGET=${BUDGET:-570}
want() {
  [[ " ${STAGES:-pytest moe_fp8 teardown costs gpu_check calibrate overhead} " == *" $1 "* ]] || return 1
  local used=$(( $(date +%s) - T0 ))
  if (( used + $2 > BUDGET )); then echo "=== $1 skipped: ${used} s used, needs up to $2 s of ${BUDGET}"; return 1; fi
}

stage setup
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || echo "wheel install failed"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,mig.mode.current --format=csv
python3 -c "import sys, torch, zmq, pynvml, msgpack, psutil; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'pyzmq', zmq.__version__, 'nvml-py', getattr(pynvml, '__version__', '?'))"
command -v ncu && ncu --version | tail -1

if want pytest 120; then
stage "pytest tests/test_gpu.py"
timeout 120 python3 -m pytest tests/test_gpu.py -p no:cacheprovider -p no:asyncio -s -q -rs \
  > "$OUT/pytest_gpu.log" 2>&1
echo "pytest rc=$?"; grep -E "^\[gpu\]|passed|failed|skipped|FAILED|Error" "$OUT/pytest_gpu.log" | cut -c1-400
fi

if want moe_fp8 150; then
stage "bench/gpu_moe_fp8.py"
timeout 150 python3 bench/gpu_moe_fp8.py > "$OUT/moe_fp8.json"
echo "moe_fp8 rc=$?"; head -c 6000 "$OUT/moe_fp8.json"; echo
fi

if want teardown 100; then
stage "bench/cupti_teardown.py"
timeout 100 python3 bench/cupti_teardown.py > "$OUT/teardown.json"
echo "teardown rc=$?"; cat "$OUT/teardown.json"
fi

if want costs 90; then
stage "bench/probe_costs.py"
timeout 90 python3 bench/probe_costs.py ${COSTS_ARGS:-} > "$OUT/costs.json"
echo "costs rc=$?"; cat "$OUT/costs.json"
fi

if want gpu_check 240; then
stage "bench/gpu_check.py"
timeout 240 python3 bench/gpu_check.py --out "$OUT/rec" --json "$OUT/gpu_check.json" > /dev/null
echo "gpu_check rc=$?"
python3 - "$OUT/gpu_check.json" <<'EOF' || true
import json, sys
d = json.load(open(sys.argv[1]))
for m in ("small", "large"):
    r = d.get(m, {})
    mon = r.get("time_with_probe", {}).get("monitor", {})
    print(m, "errors:", list(r.get("errors", {})), "overhead:", r.get("probe_overhead", {}).get("median_ratio"),
          "mfu:", mon.get("mfu"), "tensor:", mon.get("telemetry", {}).get("tensor_active"),
          "gpu_util:", mon.get("telemetry", {}).get("gpu_util"))
EOF
for f in "$OUT"/rec/*.rec; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename "$f").gz"; done
rm -rf "$OUT/rec"
fi

if want calibrate 120; then
stage "flowtop calibrate"
timeout 120 python3 -m flowtop.cli calibrate --steps 2 --skip 5 -- \
  python3 -m flowtop.tools.demo.train --device cuda --dtype bf16 --steps 8 --layers 2 --width 256 \
  --seq 256 --batch 4 > "$OUT/calibrate.txt"
echo "calibrate rc=$?"; tail -22 "$OUT/calibrate.txt"
fi

if want overhead 120; then
stage "bench/overhead.py --device cuda"
{
  # blocks of 40 steps: each attached block has a FLOP count and kernel windows to amortize
  timeout 60 python3 bench/overhead.py --device cuda --layers 12 --width 1024 --seq 1024 \
    --batch 8 --block 40 --rounds 3
  timeout 60 python3 bench/overhead.py --device cuda --block 40 --rounds 4
} > "$OUT/overhead.json"
echo "overhead rc=$?"; cat "$OUT/overhead.json"
fi
stage done
