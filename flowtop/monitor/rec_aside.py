"""A recording's path that already holds a file: that file is moved aside, never emptied. No Textual.

A trial: ``flowtop serve --record run.rec`` restarted after its monitor was killed (the same
command line, as a user or a service manager reruns it) emptied the first run's 500 KB recording
without a word. The earlier file now keeps its bytes under the first free name ``run.rec.N``,
and the monitor says where (flowtop.monitor.collector).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: The most earlier files kept beside one path (``run.rec.1`` … ``run.rec.999``).
MAX_ASIDE = 999


def keep_aside(path: Path) -> Path | None:
    """Move the non-empty regular file at ``path`` (a symlink's target, beside that target) to a
    free ``path.N``, the number after the highest there (so numbers follow age), and return that
    name; None where there is none (no file, an empty one, or not a regular file: ``/dev/full``,
    a pipe). Raises OSError where it cannot be moved (a directory the user may not write to, or
    every name taken): the caller must then not write there."""
    real = Path(os.path.realpath(path))  # a link's target is moved, the link kept to write through
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    for n in _numbers(real):
        aside = real.with_name(f"{real.name}.{n}")
        try:
            if _move_unless_taken(real, aside):
                return aside
        except FileNotFoundError:
            return None  # moved away meanwhile: nothing left to keep
    raise OSError(f"{real}.1 to .{MAX_ASIDE} are all taken")


def _numbers(real: Path) -> list[int]:
    """The N to try for ``real.N``: after the highest kept, then any free one below it."""
    prefix = real.name + "."
    try:
        names = os.listdir(real.parent)
    except OSError:
        names = []
    # ASCII and at most MAX_ASIDE's digits: "run.rec.²" or a 5,000-digit suffix is no number of ours
    tails = [n[len(prefix):] for n in names if n.startswith(prefix)]
    kept = [int(t) for t in tails if t.isascii() and t.isdigit() and len(t) <= len(str(MAX_ASIDE))]
    top = max([k for k in kept if k <= MAX_ASIDE], default=0)
    return list(range(top + 1, MAX_ASIDE + 1)) + list(range(1, top + 1))


def _move_unless_taken(real: Path, aside: Path) -> bool:
    """Move ``real`` to ``aside`` unless a file is there, without a window in which a second
    monitor's move could replace it (a rename replaces silently): a hard link fails where the name
    is taken, then the old name goes. Where links are not supported, a rename after a look."""
    try:
        os.link(real, aside)
    except FileExistsError:
        return False
    except FileNotFoundError:
        raise  # gone meanwhile (another monitor moved it): the caller finds nothing to keep
    except OSError:  # no hard links here (some network and FUSE file systems)
        if os.path.lexists(aside):
            return False
        os.rename(real, aside)
        return True
    try:
        os.unlink(real)
    except OSError:  # linked but not movable (a sticky directory, another user's file): undone
        os.unlink(aside)
        raise
    return True
