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
    """Move the non-empty regular file at ``path`` to the first free ``path.N`` and return that
    name; None where there is none (no file, an empty one, or not a regular file: ``/dev/full``,
    a pipe). Raises OSError where it cannot be moved (a directory the user may not write to, or
    every name taken): the caller must then not write there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    for n in range(1, MAX_ASIDE + 1):
        aside = path.with_name(f"{path.name}.{n}")
        if not os.path.lexists(aside):
            os.rename(path, aside)
            return aside
    raise OSError(f"{path}.1 to .{MAX_ASIDE} are all taken")
