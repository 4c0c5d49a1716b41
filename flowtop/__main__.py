"""``python -m flowtop``: the ``flowtop`` command, for an environment whose console scripts are
not on PATH (a venv not activated, ``pip install --user``, a job script run by another shell)."""

from flowtop.cli import main

if __name__ == "__main__":  # imported (the layout and boundary tests import every module): nothing runs
    raise SystemExit(main())
