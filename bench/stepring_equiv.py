"""StepRing against a base commit's: random frames of 0..300 records (NaN waits/leads, columns
not sent, a first record past 0, record-by-record appends, caps 1..300) into both rings, every
reader (len, recent_len, nbytes, recent, column, history_columns, values, last, last_recv)
compared after each write.

    PYTHONPATH=. python bench/stepring_equiv.py BASE_REV [SEEDS]   # e.g. ffe5bc3~1 150

Prints "equal after N writes" or stops at the first difference (AssertionError: seed, write).
"""
import importlib.util
import random
import subprocess
import sys
import tempfile
from array import array

from flowtop.monitor.stepring import StepRing as New

_src = subprocess.run(["git", "show", f"{sys.argv[1]}:flowtop/monitor/stepring.py"], check=True,
                      capture_output=True, text=True).stdout
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as _f:
    _f.write(_src)
_spec = importlib.util.spec_from_file_location("base_stepring", _f.name)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
Old = _mod.StepRing
NAN = float("nan")
SIZES = [1, 63, 64, 65, 128, 200, 300, 2, 62, 127, 129, 191, 192, 193, 0, 5, 30]
def state(r):
    return (len(r), r.recent_len, bool(r), r.nbytes, [tuple(x) for x in r.recent(1000)],
            [tuple(r.column(c, m)) for c in range(7) for m in (None, 0, 1, 64, 65, 120)],
            [tuple(tuple(v) for v in r.history_columns(m)) for m in (0, 1, 120, 128)],
            [r.values(c, m) for c in range(7) for m in (1, 63, 200)],
            tuple(r.last()) if r else None, r.last_recv() if r else None)


def _sent(rng: random.Random, mode: int, n: int) -> array:
    """A wait or lead column; mode 2: NaN (not sent) in ~40 % of the records."""
    return array("d", [rng.random() if mode != 2 or rng.random() < .6 else NAN for _ in range(n)])


checks = 0
for seed in range(int(sys.argv[2]) if len(sys.argv) > 2 else 150):
    rng = random.Random(seed)
    cap, recent = rng.choice([(256, 128), (5, 3), (64, 64), (65, 1), (100, 30), (130, 70), (1, 1), (300, 200)])
    a, b = Old(cap, recent), New(cap, recent)
    step = 1
    for it in range(80):
        n = rng.choice(SIZES)
        mode = rng.randrange(4)
        st = array("q", range(step, step + n))
        wl = array("d", [rng.random() for _ in range(n)])
        tk = array("q", [rng.randrange(1 << 40) for _ in range(n)])
        wt = None if mode == 1 else _sent(rng, mode, n)
        ld = None if mode == 3 else _sent(rng, mode, n)
        start = rng.choice([0, 0, 1, 3]) if n > 3 else 0
        recv = float(it)
        if rng.random() < .2:
            for i in range(start, n):
                rec = (st[i], wl[i], tk[i], None if wt is None or wt[i] != wt[i] else wt[i], recv,
                       None if ld is None or ld[i] != ld[i] else ld[i])
                a.append(rec)
                b.append(rec)
        else:
            fin = mode == 0 and rng.random() < .5
            a.extend(st, wl, tk, wt, ld, recv, start, fin)
            b.extend(st, wl, tk, wt, ld, recv, start, fin)
        step += n + 1
        sa, sb = state(a), state(b)
        assert repr(sa) == repr(sb), (seed, it, n, cap, recent)
        checks += 1
print("equal after", checks, "writes")
