"""The probe's steady state costs little: the step tracker publishes the common step itself, the
runtime is called only at steps that need it, and the sender thread wakes no more than needed."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import pytest

import probe
import step_spy

torch = pytest.importorskip("torch", reason="the probe needs torch (pip install -e .[train])")
nn = torch.nn


@pytest.fixture
def attached(monkeypatch: pytest.MonkeyPatch) -> Any:
    with _attached(monkeypatch) as got:
        yield got


@contextlib.contextmanager
def _attached(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("FLOWTOP_TELEMETRY", "0")
    monkeypatch.setenv("FLOWTOP_ADDR", "tcp://127.0.0.1:1")  # nobody listens
    monkeypatch.setenv("FLOWTOP_KERNELS_MIN_STEPS", "16")
    assert probe.attach(job="quiet")
    p = probe._current()
    out: list[tuple[str, dict[str, Any]]] = []
    step_spy.spy(p, out)
    try:
        yield p, out
    finally:
        probe.detach()


def test_steady_steps_skip_the_runtime_and_publish_the_same_records(attached: Any) -> None:
    p, out = attached
    seen: list[int] = []
    full = p.tracker._on_step

    def spy(fields: dict[str, Any]) -> None:
        seen.append(fields["step"])
        full(fields)

    p.tracker._on_step = spy
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(40):
        model(torch.randint(0, 50, (2, 6))).logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
    steps = [f for k, f in out if k == "step"]
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert all(s["tokens"] == 12 and s["micro_batches"] == 1 and s["probe_s"] > 0 for s in steps)
    assert {frozenset(s) for s in steps[5:]} == {frozenset(steps[1])}  # same fields either way
    # Step 1 (setup), the FLOP count (step 2) and the three steps that charge its cost go through
    # the runtime (no monitor listens, so no kernel window is due); the tracker publishes the rest.
    assert seen == [1, 2, 3, 4, 5]
    assert p.tracker.ewma_step_s is not None and len(p.tracker.recent_walls) == 5


def test_a_refused_command_is_reported_once_and_steps_go_quiet_again(attached: Any) -> None:
    """A refusal (a malformed command, a window request over the rate limit) goes out on the next
    step message, through the runtime; after that the tracker's fast path resumes: a running total
    that stays above 0 must not keep every later step on the slow path."""
    p, out = attached
    seen: list[int] = []
    full = p.tracker._on_step

    def spy(fields: dict[str, Any]) -> None:
        seen.append(fields["step"])
        full(fields)

    p.tracker._on_step = spy
    model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def train(n: int) -> None:
        for _ in range(n):
            model(torch.randint(0, 50, (2, 6))).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()

    train(10)  # steps 1-5 through the runtime, then quiet
    p.publisher.control_rejected += 1  # what the sender thread counts for a malformed command
    p._sender_round()
    train(10)
    steps = {f["step"]: f for k, f in out if k == "step"}
    assert seen == [1, 2, 3, 4, 5, 11]  # the step after the refusal, then quiet again
    assert steps[11]["commands_refused"] == 1 and "commands_refused" not in steps[12]
    p._sender_round()  # nothing new: no wake-up
    train(5)
    assert seen == [1, 2, 3, 4, 5, 11]


class _KeywordLM(nn.Module):
    """A Hugging Face style forward: tensors by keyword, a scalar flag among them."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(50, 8), nn.Linear(8, 50)

    def forward(self, input_ids: Any, labels: Any, use_cache: bool = False) -> Any:
        return nn.functional.cross_entropy(self.out(self.emb(input_ids)).flatten(0, 1), labels.flatten())


@pytest.mark.parametrize(("by_keyword", "new"), [(False, "shape"), (True, "shape"), (False, "dtype"),
                                                 (False, "resized"), (True, "resized")])
def test_quiet_steps_call_no_flop_listener(monkeypatch: pytest.MonkeyPatch, by_keyword: bool, new: str) -> None:
    """Once a count is in force, a step with the same inputs pays the signature alone: the FLOP
    sampler's forward listener is not called, and torch calls nothing of the probe's before the
    optimizer (its pre-hook is gone); a new input shape (or dtype: the signature has both) calls
    the listener again and brings the pre-hook back for that step's optimizer (counted, then quiet
    again). The same tensor objects fed every step and resized in place ("resized") are a new
    shape too: the steady test compares shapes, not tensor identity."""
    from probe.steps.tracker import StepTracker

    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "100")  # counts may cost anything: no gap after one
    pre_hook_steps: list[int] = []
    real = StepTracker._opt_pre_hook

    def pre_hook(self: Any, *args: Any) -> None:
        pre_hook_steps.append(self.step + 1)
        real(self, *args)

    monkeypatch.setattr(StepTracker, "_opt_pre_hook", pre_hook)  # what install() registers
    with _attached(monkeypatch) as (p, out):
        _train_and_check(p, out, by_keyword, new)
    assert pre_hook_steps == [1, 2, 3, 21, 22]


def _train_and_check(p: Any, out: list[tuple[str, dict[str, Any]]], by_keyword: bool, new: str = "shape") -> None:
    t = p.tracker
    forward_calls: list[int] = []
    listener = t.listeners_forward[-1]

    def spy(sig: Any) -> None:
        forward_calls.append(t.step + 1)
        listener(sig)

    t.listeners_forward[-1] = spy
    model = _KeywordLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pre_opt: list[int] = []
    fed = torch.randint(0, 50, (2, 6))  # the one batch tensor of the "resized" loop
    for i in range(30):
        seq = 6 if i < 20 or new != "shape" else 9  # a new shape at step 21 ...
        ids = torch.randint(0, 50, (2, seq))
        if new == "resized":  # ... or the same tensor object, grown in place
            ids = fed.resize_(2, 9).random_(0, 50) if i == 20 else fed
        first = ids.int() if new == "dtype" and i >= 20 else ids  # ... or the same shape in int32
        loss = model(input_ids=first, labels=ids, use_cache=i % 2 == 0) if by_keyword else model(first, ids)
        pre_opt.append(len(t.listeners_pre_opt))
        loss.backward()
        opt.step()
        opt.zero_grad()
    counted = [f["step"] for k, f in out if k == "flops"]
    assert counted == [2, 21]  # the first steady step, the new shape
    # The embedding is fed the root's first input: tokens follow its shape, resized or not.
    grown = new in ("shape", "resized")
    assert [f["tokens"] for k, f in out if k == "step"] == [12] * 20 + [18 if grown else 12] * 10
    # Step 1 decides nothing (warm-up), step 2 opens the count, step 3 finds it in force and turns
    # quiet; step 21's new shape is seen and counted, step 22 turns quiet again.
    assert forward_calls == [1, 2, 3, 21, 22]
    assert [i + 1 for i, n in enumerate(pre_opt) if n] == [2, 21]  # a window to close: counted steps only


def test_an_input_without_plain_sizes_keeps_the_probe_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A nested tensor among the root's inputs has no shape to read: its signature is the walk's
    "unknown" one (counted once, then carried), and neither step tracking nor FLOP counting stops
    (reading its shape raises inside the hook)."""

    class Nested(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, jagged: Any, x: Any) -> Any:
            return self.lin(x).sum()

    with _attached(monkeypatch) as (p, out):
        model = Nested()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nested tensors are a prototype (strided layout)
            jagged = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 4)])
        for _ in range(6):
            model(jagged, torch.ones(2, 4)).backward()
            opt.step()
            opt.zero_grad()
        assert probe._current() is p and p.tracker.signature == ("?",)
    assert [f["step"] for k, f in out if k == "step"] == list(range(1, 7))
    # Linear(4, 4) on 2 rows: 2·2·4·4 forward, as much for the weight's gradient (x needs none)
    assert [(f["step"], f["model_flops"]) for k, f in out if k == "flops"] == [(2, 2 * (2 * 2 * 4 * 4))]


def test_a_carried_count_is_re_sent_with_the_step_and_tokens_that_counted_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequence length 6 (12 tokens a step) is counted at step 2, length 9 (18 tokens) at step 11;
    when length 6 comes back at step 21 its count is re-sent as it was counted: at step 2, with
    12 tokens (not the step of the newest count)."""
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "100")
    with _attached(monkeypatch) as (p, out):
        model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(25):
            seq = 9 if 10 <= i < 20 else 6
            model(torch.randint(0, 50, (2, seq))).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    sent = [(f["step"], f["tokens"], f["model_flops"]) for k, f in out if k == "flops"]
    assert [s[:2] for s in sent] == [(2, 12), (11, 18), (2, 12)]
    assert sent[2][2] == sent[0][2] != sent[1][2]


def test_the_message_fields_of_carried_counts_are_dropped_with_the_policys_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for two counts: lengths 6, 9, 6 again (its count re-sent: used last), then 12 is
    counted, and the policy drops the least recently used count, 9's. Length 6's message fields
    must still be there when it comes back at step 36: re-sent as counted at step 2, 12 tokens."""
    monkeypatch.setenv("FLOWTOP_FLOPS_BUDGET", "100")
    with _attached(monkeypatch) as (p, out):
        p._flops.policy.max_signatures = 2
        model = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 50))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(40):
            seq = 9 if 10 <= i < 20 else 12 if 25 <= i < 35 else 6
            model(torch.randint(0, 50, (2, seq))).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    sent = [(f["step"], f["tokens"]) for k, f in out if k == "flops"]
    assert sent == [(2, 12), (11, 18), (2, 12), (26, 24), (2, 12)]
