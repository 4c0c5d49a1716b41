"""CountPolicy (which steps are counted) and signature_of (what a step's inputs look like)."""

from __future__ import annotations

import torch
from torch import nn

from probe.flops.count import FlopCount
from probe.flops.counter import CountPolicy, StepFlopCounter, signature_of
from probe.flops.policy import cached_signature


def fake_count(model_flops: int) -> FlopCount:
    return FlopCount(model_flops, model_flops, "full", "fp32")


def run(policy: CountPolicy, signatures: list[tuple]) -> list[int]:
    """Simulate a loop: decide at each step with the signature known then, record a count."""
    counted = []
    for step, sig in enumerate(signatures):
        if policy.should_count(step, sig):
            counted.append(step)
            policy.record(sig, fake_count(step))
    return counted


A, B, C = ("a",), ("b",), ("c",)


def test_first_steady_step_only_when_nothing_changes() -> None:
    policy = CountPolicy(warmup=1, recheck_every=500)
    assert run(policy, [A] * 100) == [1]
    assert policy.decisions == 1
    assert policy.carried(A).model_flops == 1
    assert policy.carried(B) is None


def test_warmup_is_configurable() -> None:
    assert run(CountPolicy(warmup=3), [A] * 10) == [3]
    assert run(CountPolicy(warmup=0), [A] * 10) == [0]


def test_recount_when_signature_changes_but_not_for_known_ones() -> None:
    policy = CountPolicy(warmup=1, recheck_every=500)
    sigs = [A] * 10 + [B] * 10 + [A] * 10 + [C] * 5
    assert run(policy, sigs) == [1, 10, 30]  # A known again at 20: carried, not recounted
    assert policy.carried(A).model_flops == 1
    assert policy.carried(B).model_flops == 10


def test_periodic_recheck() -> None:
    policy = CountPolicy(warmup=1, recheck_every=100)
    assert run(policy, [A] * 350) == [1, 101, 201, 301]
    assert policy.carried(A).model_flops == 301  # the re-check replaces the carried count
    assert run(CountPolicy(recheck_every=0), [A] * 350) == [1]


def test_min_gap_limits_counting_of_ever_changing_shapes() -> None:
    sigs = [(n,) for n in range(40)]  # a new sequence length every step
    assert run(CountPolicy(warmup=1), sigs) == list(range(1, 40))
    assert run(CountPolicy(warmup=1, min_gap=10), sigs) == [1, 11, 21, 31]


def test_failed_count_is_not_retried_until_recheck() -> None:
    policy = CountPolicy(warmup=1, recheck_every=50)
    counted = []
    for step in range(120):
        if policy.should_count(step, A):
            counted.append(step)
            policy.record(A, None)
    assert counted == [1, 51, 101]
    assert policy.carried(A) is None


def test_carried_counts_are_bounded() -> None:
    policy = CountPolicy(warmup=0, max_signatures=2)
    run(policy, [A, B, C])
    assert policy.carried(A) is None and policy.carried(C) is not None


def test_signature_of_shapes_and_dtypes_only() -> None:
    ids = torch.zeros(4, 128, dtype=torch.long)
    mask = torch.ones(4, 128)
    sig = signature_of((ids,), {"attention_mask": mask, "step": 7, "extra": [mask, {"x": ids}]})
    assert sig == (
        ("0", (4, 128), "int64"),
        ("attention_mask", (4, 128), "float32"),
        ("extra.0", (4, 128), "float32"),
        ("extra.1.x", (4, 128), "int64"),
    )
    # a changed non-tensor value keeps the signature; a changed length does not
    assert signature_of((ids,), {"step": 8}) == signature_of((ids,), {"step": 9})
    assert signature_of((ids,), {}) != signature_of((torch.zeros(4, 64, dtype=torch.long),), {})
    hash(sig)


def test_cached_signature_gives_the_same_tuple_for_keyword_tensors_too() -> None:
    """A Hugging Face model is called with input_ids=, attention_mask=, labels=: the same shapes
    give the very same tuple (the FLOP sampler's quiet test is an identity check), equal to the
    full walk's; scalar keywords are passed over as the walk ignores them; a new shape, dtype or
    name is a new signature; a container falls back to the walk."""
    cache: dict = {}
    ids, mask = torch.zeros(4, 128, dtype=torch.long), torch.ones(4, 128)
    kw = {"input_ids": ids, "attention_mask": mask, "use_cache": False, "n": 3, "tag": None}
    first = cached_signature(cache, (), kw)
    assert first == (("input_ids", (4, 128), "int64"), ("attention_mask", (4, 128), "float32"))
    assert cached_signature(cache, (), {**kw, "use_cache": True, "n": 4}) is first
    assert cached_signature(cache, (), dict(kw, input_ids=torch.zeros(4, 128, dtype=torch.long))) is first
    longer = cached_signature(cache, (), dict(kw, input_ids=torch.zeros(4, 256, dtype=torch.long)))
    assert longer != first and longer[0] == ("input_ids", (4, 256), "int64")
    assert cached_signature(cache, (), dict(kw, attention_mask=mask.half()))[1][2] == "float16"
    assert cached_signature(cache, (ids,), {"attention_mask": mask}) == (
        ("0", (4, 128), "int64"), ("attention_mask", (4, 128), "float32"))  # not the keyword's path
    assert cached_signature(cache, (), {"labels": ids, "attention_mask": mask})[0][0] == "labels"
    nested = {"input_ids": ids, "extra": [mask]}
    assert cached_signature(cache, (), nested) == signature_of((), nested)
    assert len(cache) == 5  # the container never entered the cache


def test_signature_of_never_raises() -> None:
    class Weird(dict):
        def items(self):  # noqa: ANN202
            raise RuntimeError("boom")

    assert signature_of((Weird(),), {}) == ("?",)


def test_policy_drives_counter_invocations() -> None:
    """End to end: a training loop counts exactly the steps the policy picks."""
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counter, policy = StepFlopCounter(root=model), CountPolicy(warmup=1, recheck_every=6)
    lengths = [4, 4, 4, 4, 6, 6, 6, 6, 6, 6]
    counted, last_sig = [], ()
    for step, n in enumerate(lengths):
        counting = policy.should_count(step, last_sig)
        if counting:
            counter.start()
        x = torch.randn(n, 8)
        last_sig = signature_of((x,), {})
        model(x).sum().backward()
        if counting:
            result = counter.stop()  # the optimizer-step pre-hook
            policy.record(last_sig, result)
            counted.append((step, result.model_flops))
        opt.step()
        opt.zero_grad()
    # step 1: first steady; step 5: the first decision after length 6 was seen (step 4);
    # the re-check interval runs from the last count (5), so the next would be step 11
    assert counted == [(1, 2 * 4 * 8 * 8 * 2), (5, 2 * 6 * 8 * 8 * 2)]
    assert policy.carried(signature_of((torch.randn(6, 8),), {})).model_flops == 2 * 6 * 8 * 8 * 2
