"""The hint rules table: thresholds, hysteresis, evidence windows, texts and actions, as data.

Every rule watches one *measure* (a number named with its unit, e.g. ``input_wait_pct``) per
target. It fires when the measure is beyond ``threshold`` (and every gate holds) for at least the
evidence window, and clears only when the measure falls back past the looser ``clear`` value (or a
gate fails even at its looser value). Thresholds start from the values established tools use
(docs/hints.md, "Where the thresholds come from") and are meant to be tuned with evidence: change
them here, nowhere else.

The summary templates are formatted with the hint's evidence plus ``target`` and a few text
fields the measure supplies (``str.format`` syntax). README.md ("Bottleneck hints") documents this table.
"""

from __future__ import annotations

from typing import Mapping

from flowtop.monitor.hints.rules_kernels import KERNEL_RULES, MEMORY_CATEGORIES
from flowtop.monitor.hints.schema import SCOPES, SEVERITIES, TUNABLE, Gate, Rule, apply_overrides, validate

__all__ = ["RULES", "RULES_BY_ID", "GROUPS", "MEMORY_CATEGORIES", "SCOPES", "SEVERITIES", "TUNABLE", "Gate",
           "Rule", "apply_overrides", "validate"]

RULES: tuple[Rule, ...] = (
    Rule(
        id="hang_all",
        cost=85,
        scope="job",
        severity="critical",
        measure="stalled_x",
        unit="x",
        direction="above",
        threshold=1.0,
        clear=0.5,
        window_steps=0,
        window_s=0.0,
        summary="{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s "
        "(a step usually takes {median_step_time_s:.3g} s)",
        variants={
            # Blocked ranks keep sending heartbeats; a stopped or dead one falls silent.
            "silent": "{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s; "
            "nothing heard from {silent} for {silent_s:.0f} s (stopped, dead or its host is down)"
            "{others_wait}",
            # Silent since before the first bye: killed outright, the endings after it its consequences.
            "silent_first": "{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s; nothing "
            "heard from {silent} for {silent_s:.0f} s, since before {after}: it likely died without a word "
            "(SIGKILL, the OOM killer, a segfault, its host or network down){others_wait}",
            # A rank of the world never heard: a monitor started after it stopped, or it never
            # reached this monitor; the others' hellos said how long they have waited.
            "unheard": "{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s; nothing ever "
            "heard from {unheard} of {world} (stopped before this monitor started, dead, or not reaching it)"
            "{others_wait}",
            # A rank that crashed (its bye named the exception) is what the others wait for.
            "failed": "{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s since {failed} "
            "failed ({why}); they likely wait for it in a collective",
            # A rank a signal ended mid-run (scancel, a preemption, a node's launcher killed; its
            # bye named the signal): NCCL peers hang in the collective it left, gloo peers fail
            # ("then": those, after it). Whichever ended first names the variant
            # (snapshot.first_ending): a crash first is "failed", its peers SIGTERMed after it.
            "stopped": "{ranks_phrase} stopped at step {last_step}: no step for {stalled_s:.0f} s since a signal "
            "({signal}) ended {stopped}{then}; they likely wait for it in a collective",
        },
        action="Dump the stacks of all ranks (py-spy dump --pid PID); look for a rank that left a "
        "collective (exception, OOM, uneven batch count); rerun with NCCL_DEBUG=INFO and "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1 so a stuck collective times out.",
        params={"factor": 10.0, "floor_s": 30.0},
        doc="time since the last step of the least-stalled running rank ÷ max(factor × median "
        "step time, floor_s); names the ranks that failed (their exception), a signal stopped (SIGTERM) or "
        "went silent (stale) while "
        "others still talk (a silence before the first of those endings as their cause: a rank killed "
        "outright), else those of the world never heard; a rank's last step may be the one its "
        "hello reported (a monitor started during a hang)",
    ),
    Rule(
        id="hang_rank",
        cost=30,
        scope="rank",
        severity="critical",
        measure="stalled_x",
        unit="x",
        direction="above",
        threshold=1.0,
        clear=0.5,
        window_steps=0,
        window_s=0.0,
        summary="{target} has not finished a step for {stalled_s:.0f} s (a step usually takes "
        "{median_step_time_s:.3g} s); last step {last_step}",
        action="Dump that rank's stack (py-spy dump --pid {pid}); check its log for an exception "
        "or OOM and whether the other ranks wait for it in a collective.",
        params={"factor": 10.0, "floor_s": 30.0, "hidden_by": "hang_all"},
        doc="time since the rank's last step (or last message, if longer) ÷ max(factor × median "
        "step time, floor_s); hidden while hang_all is shown",
    ),
    Rule(
        id="rank_conflict",
        scope="rank",
        severity="critical",
        measure="other_processes",
        unit="n",
        direction="above",
        threshold=0.5,
        clear=0.5,
        window_steps=1,
        window_s=0.0,
        summary="{processes_n} processes claim {target} of job {job} ({claimants}): shown as "
        "separate rows, each counted in the job's totals",
        action="The launcher set no RANK and the probe could not read the process group: pass "
        "rank= (and world_size=) to probe.attach, or set RANK and WORLD_SIZE for each process.",
        doc="processes other than one that claim the same (job, rank, incarnation) while running "
        "at the same time (kept apart, never merged); the evidence starts once every claimant "
        "has made a step",
    ),
    Rule(
        id="relay_silent",
        cost=0.5,  # a pass over the ranks' cut (0.46 ms at 4,096 ranks, none cut)
        scope="job",
        severity="warning",
        measure="unheard_ranks",
        unit="n",
        direction="above",
        threshold=0.5,
        clear=0.5,
        window_steps=0,
        window_s=0.0,
        summary="{unheard_ranks:.0f} {ranks_word} unheard behind {relays_phrase} while the other {stepping_ranks} "
        "step on: they may still train; the job's MFU, FLOP/s and tokens/s are over the heard ranks",
        # A relay silent (not closed): since when, said at display (flowtop.monitor.hintclock).
        variants={"silent": "{unheard_ranks:.0f} {ranks_word} unheard behind {relays_phrase}, {silent_word} for "
                  "{silent_s:.0f} s, while the other {stepping_ranks} step on: they may still train; the job's "
                  "MFU, FLOP/s and tokens/s are over the heard ranks",
                  "all": "every rank ({unheard_ranks:.0f}) unheard behind {relays_phrase}: they may still train; "
                  "no rank is heard, so the job has no figures",
                  "all_silent": "every rank ({unheard_ranks:.0f}) unheard behind {relays_phrase}, {silent_word} "
                  "for {silent_s:.0f} s: they may still train; no rank is heard, so the job has no figures"},
        action="Check the relay on {hosts}: with torchrun it is that node's `flowtop run` (killed, OOM?); "
        "start `flowtop relay --connect ADDR` there and its ranks reconnect to it as to a restarted monitor.",
        doc="rank processes cut off behind a node relay silent for 3 s or closed (JobSnapshot.unheard) "
        "while a heard rank still steps, or when no rank is heard at all; names each relay, since when "
        "and its ranks; the job's figures leave those ranks out (0 while none, or heard ranks but none "
        "steps: the hang rules say that)",
    ),
    Rule(
        id="input_wait",
        cost=68,
        scope="rank",
        severity="warning",
        measure="input_wait_pct",
        unit="pct",
        direction="above",
        threshold=5.0,
        clear=3.0,
        window_steps=10,
        window_s=0.0,
        summary="{target} waits for input {input_wait_pct:.0f} % of each step",
        action="Feed the device faster: raise DataLoader num_workers, set pin_memory=True and "
        "persistent_workers=True, raise prefetch_factor; move decoding/augmentation off the "
        "training process or pre-tokenize the data.",
        gates=(Gate("device_idle_pct", ">=", 10.0, 5.0),),
        critical_at=25.0,
        doc="Σ input wait ÷ Σ step time over the last window_steps steps past the run's first 3 (the "
        "loader's start: workers spawned, files opened), less one step whose wait is more than half "
        "the window's (a pause between steps: a checkpoint, an eval, a sleep; `pause_left_out_s`); gate: "
        "the device idles (100 − NVML GPU-Util, else 1 − busy of the kernel window; a CPU rank counts as idle) — a "
        "GPU-bound job's host waits wherever the launch queue fills, and that costs nothing; not read on "
        "a rank that runs no first pipeline stage (its wait is for the earlier stage's activations)",
    ),
    Rule(
        id="step_spikes",
        cost=2,
        scope="job",
        severity="warning",
        measure="spike_pct",
        unit="pct",
        direction="above",
        threshold=10.0,
        clear=5.0,
        window_steps=200,
        window_s=0.0,
        summary="{spike_pct:.0f} % of the last {window_steps} steps' time went to slow steps ({spikes} of them, "
        "up to {max_step_s:.3g} s; a step usually takes {median_step_time_s:.3g} s): FLOP/s and MFU, taken "
        "over the median step, leave that time out",
        action="Find what runs every few steps: data loading (starved DataLoader workers, a shard "
        "boundary), garbage collection (gc.freeze() after setup), a checkpoint or an evaluation in the "
        "loop, a host sync (.item(), printing a tensor); py-spy record --pid PID over a few slow steps.",
        params={"factor": 3.0},
        critical_at=30.0,
        doc="Σ over the last window_steps steps of the time beyond factor × the median step ÷ Σ step "
        "time, on the running rank with the most (64 ranks at most read, evenly spaced: in synchronous "
        "training a stall shows on every rank); 3 slow steps in the window at least, none of the first "
        "20 steps (one-off slow steps: warm-up, a checkpoint, the probe's sampled work)",
    ),
    Rule(
        id="straggler",
        cost=104,
        scope="rank",
        severity="warning",
        measure="slower_pct",
        unit="pct",
        direction="above",
        threshold=10.0,
        clear=5.0,
        window_steps=20,
        window_s=0.0,
        # Each figure says what it is: a median step time over the steps compared (the rank table's
        # is over the rank's own last 32), or a pace on the monitor's receive clock (no step time).
        summary="{target} is {slower_pct:.0f} % slower than the other ranks by median step time over "
        "the same {window_steps} steps ({step_time_s:.3g} s vs their median {others_step_time_s:.3g} s) "
        "since step {since_step}",
        variants={
            # Its steps reach the monitor slower than the others' (time between steps received).
            "pace": "{target} reaches its steps {slower_pct:.0f} % slower than the other ranks: "
            "{pace_s_per_step:.3g} s per step vs their median {others_pace_s_per_step:.3g} s, on the "
            "monitor's receive clock over its last {pace_steps} steps ({pace_span_s:.3g} s){step_times}; "
            "since step {since_step}",
            # Synchronous data parallelism: step times are equal, the others wait for this rank.
            "lead": "{target} finishes its forward {lead_lag_ms} ms after the others each step "
            "({lag_pct_of_step:.0f} % of the step); they wait for it in the gradient all-reduce",
        },
        action="Compare that rank with the others: its input wait and GPU clock/throttling, other "
        "processes on its GPU or host (nvidia-smi, top), its share of the data (sequence "
        "lengths) and its host's network.",
        critical_at=50.0,
        # since_steps: how far back "since step N" looks. relative: each rank is measured against
        # the others, so a hint held past its clear value (HOLD_S) goes once another rank's is
        # measured (flowtop.monitor.hints.engine._drop_held): never "rank 0 is behind rank 1" beside
        # "rank 1 is behind rank 0".
        params={"since_steps": 256, "relative": True},
        doc="the largest of three ways a rank lags over the last window_steps step indices all ranks "
        "reported: its median step time, and its time to go from the first to the last of those "
        "indices (aligned by step), ÷ the other ranks' median − 1; and its lead (step boundary → end "
        "of its last forward) minus the other ranks' median lead, as a share of its step time "
        "(median over the steps). When no step index is in every rank's history (a large job's "
        "fast steps under a long pace), each rank's median step time and lead over a window on a "
        "grid of window_steps indices against those of the ranks (three or more) that reported the "
        "same window; leads (and, in those windows, every figure) compared within a pipeline stage; a "
        "pace taken over at least a second of receive time, none for a rank catching up a backlog (its steps "
        "arriving faster than half its step time)",
    ),
    *KERNEL_RULES,
    Rule(
        id="throttling",
        cost=20,
        scope="rank",
        severity="warning",
        measure="clock_pct",
        unit="pct",
        direction="below",
        threshold=90.0,
        clear=95.0,
        window_steps=0,
        window_s=5.0,
        summary="{target} GPU is throttled to {clock_pct:.0f} % of its max SM clock "
        "({sm_clock_mhz:.0f} of {sm_clock_max_mhz:.0f} MHz) by {reasons}",
        variants={
            # Seen on an H200 under bf16 GEMMs: 689-701 W of 700 W, SM clock 1440-1575 MHz.
            "power_limit": "{target} runs at its power limit ({power_w:.0f} of {power_limit_w:.0f} W), "
            "SM clock {sm_clock_mhz:.0f} of {sm_clock_max_mhz:.0f} MHz: usual under dense tensor-core "
            "work, and the datasheet peak behind MFU assumes the boost clock",
        },
        action="At the power limit under dense tensor-core work this is expected: compare the "
        "ranks' clocks (one slower GPU slows the whole synchronous job). Otherwise check cooling "
        "and power: nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER; airflow, the power limit "
        "(nvidia-smi -pl), other jobs on the node.",
        gates=(Gate("power_thermal_reasons", ">=", 1.0, 1.0),),
        params={"reasons": ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal",
                            "hw_power_brake"), "power_limit_frac": 0.85},
        doc="SM clock ÷ max SM clock; gate: a power or thermal clock-event reason is active; the "
        "software power cap alone, at ≥ power_limit_frac of the power limit (an instant reading "
        "swings around the capped average: 629–706 W at a 700 W cap on an H200): info severity "
        "(power-limited, not faulty)",
    ),
    Rule(
        id="util_vs_mfu",
        cost=15,
        scope="rank",
        severity="warning",
        measure="mfu_pct",
        unit="pct",
        direction="below",
        threshold=30.0,
        clear=35.0,
        window_steps=0,
        window_s=10.0,
        summary="{target} shows GPU-Util {gpu_util_pct:.0f} % but does only {mfu_pct:.0f} % of "
        "the peak FLOP/s (MFU){tensor_note}: GPU-Util only says some kernel was running",
        action="Trust MFU and tensor activity over GPU-Util; see the kernel screen and the "
        "launch-bound, memory-bound and fp32 hints; larger batches, bf16 and fused kernels "
        "raise MFU.",
        gates=(Gate("gpu_util_pct", ">=", 90.0, 85.0),),
        params={},
        doc="MFU in percent; gate: NVML GPU-Util ≥ 90 %",
    ),
    Rule(
        id="memory_full",
        cost=9,
        scope="rank",
        severity="info",
        measure="mem_used_pct",
        unit="pct",
        direction="above",
        threshold=90.0,
        clear=85.0,
        window_steps=0,
        window_s=5.0,
        summary="{target} GPU memory is {mem_used_pct:.0f} % full ({mem_used_gib:.1f} of "
        "{mem_total_gib:.1f} GiB)",
        action="Little headroom for longer sequences or fragmentation: activation checkpointing, "
        "a smaller micro-batch with gradient accumulation, "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.",
        doc="device memory used ÷ total (NVML)",
    ),
    Rule(
        id="uncounted_ops",
        scope="job",
        severity="info",
        measure="uncounted_pct",
        unit="pct",
        direction="above",
        threshold=1.0,
        clear=0.5,
        window_steps=0,
        window_s=0.0,
        summary="the FLOP count misses {uncounted_types_n} op type(s) ({ops}){share}: MFU is understated"
        "{share_note}",
        action="flowtop counts 0 FLOPs for ops it has no formula for; if these ops do real math "
        "(custom/Triton kernels, unusual attention), read MFU as a lower bound and compare with "
        "the 6·N + 12·L·d·T estimate.",
        params={"significant_pct": 5.0, "attention_words": ("attention", "sdpa", "flash")},
        doc="share of a rank's counted step (largest over ranks) taken by ops the FLOP counter has "
        "no formula for: their FLOP-like size from shapes ÷ (model FLOPs + it), else their kernels' "
        "share of kernel time, else 100 (unknown); tiny or elementwise-sized ops stay below 1 %; "
        "severity warning when they are attention ops whose kernels take ≥ significant_pct of kernel time",
    ),
    Rule(
        id="estimate_mismatch",
        scope="job",
        severity="info",
        measure="estimate_gap_pct",
        unit="pct",
        direction="above",
        threshold=10.0,
        clear=7.0,
        window_steps=0,
        window_s=0.0,
        summary="counted model FLOPs are {estimate_gap_pct:.0f} % {direction_word} the "
        "model-shape estimate ({estimate_source})",
        action="Check which is wrong: uncounted ops, the attention convention (full vs causal), "
        "or estimate inputs that do not fit the model (MoE, tied embeddings, padding, "
        "non-transformer layers).",
        critical_at=None,
        doc="abs(counted ÷ estimated − 1), from FlopsView.estimate_ratio",
    ),
    Rule(
        id="pipeline_imbalance",
        scope="job",
        severity="warning",
        measure="heavier_pct",
        unit="pct",
        direction="above",
        threshold=20.0,
        clear=10.0,
        window_steps=0,
        window_s=0.0,
        summary="pipeline stage {stage} ({where}) computes {heavier_pct:.0f} % more than the stages' mean "
        "({stage_flops} vs {mean_flops} per step){time_note}: the other stages wait for it every micro-batch",
        action="Move layers from that stage to the lightest one (the LM head and loss sit on the last "
        "stage, the embedding on the first costs almost no FLOPs): give the first and last stages "
        "fewer blocks, e.g. torchtitan's pipeline_parallel_layers_per_stage or your split points.",
        doc="model FLOPs per step of the heaviest pipeline stage (one data-parallel replica) ÷ the mean "
        "over the stages − 1; impact 1 − mean ÷ max (the share of the pipeline's compute the other "
        "stages spend waiting); the stages' compute times (forward and backward chunks, waits "
        "excluded) are in the evidence",
    ),
    Rule(
        id="attention_flops_note",
        cost=4,
        scope="job",
        severity="info",
        measure="attention_pct",
        unit="pct",
        direction="above",
        threshold=1.0,
        clear=0.5,
        window_steps=1,
        window_s=0.0,
        summary="fused attention kernels take {attention_pct:.0f} % of GPU time; profiler-based "
        "FLOP counts (torch.profiler with_flops) count them as 0 FLOPs, flowtop counts them by "
        "formula",
        action="Nothing to fix; expect MFU from torch.profiler-based tools to read lower than "
        "flowtop's (-15.2 % on our H200 reference step).",
        doc="fused attention kernel time ÷ summed kernel time, highest rank; 0 while the FLOP count "
        "lists an uncounted attention op (uncounted_ops covers that)",
    ),
)

#: Rules by id.
RULES_BY_ID: Mapping[str, Rule] = {r.id: r for r in RULES}

#: Names for several rules at once in overrides (``HintEngine(overrides={"hang": {...}})``).
GROUPS: Mapping[str, tuple[str, ...]] = {"hang": ("hang_all", "hang_rank")}


validate(RULES)
