"""rankstate.liveness (one look at a rank's stall, status and until when they hold, the views'
hot path) equals stalled_for, status and steady_until taken one by one."""

from __future__ import annotations

import itertools

from flowtop.monitor import rankstate as rs
from probe.wire import BYE_ERROR_PREFIX, RankKey


def test_liveness_is_stalled_for_status_and_steady_until_at_once() -> None:
    cases = 0
    for steps, hello_at, bye, med, now in itertools.product(
            (0, 3), (None, 5.0, 50.0), (None, "done", BYE_ERROR_PREFIX + "boom"), (None, 0.01, 4.0),
            (10.0, 12.0, 20.0, 40.0, 200.0)):
        st = rs.RankState(key=RankKey("j", "h", 1, 0, 0), first_seen=0.0, last_recv=11.0)
        for step in range(1, steps + 1):
            st.steps.append((step, 0.01, 8, None, 9.0 + step * 0.1, None))
            st.step = step
        st.hello_step_at, st.hello_step, st.bye = hello_at, (st.step if hello_at is not None else -1), bye
        stalled = rs.stalled_for(st, now, med)
        status = rs.status(st, now, med, stalled)
        assert rs.liveness(st, now, med) == rs.Liveness(stalled, status, rs.steady_until(st, status, med))
        cases += 1
    assert cases == 2 * 3 * 3 * 3 * 5
