"""flowtop bootstrap: attaches the probe in every Python process that imports torch.

``flowtop run`` puts this directory first on PYTHONPATH. This file must never
raise: any error is swallowed and training runs without the probe. It chains a
``sitecustomize`` that was already on the path (it is imported after ours is
removed from the module cache, so its own imports work as before, and it stays
imported as ``sitecustomize``).
"""

try:
    import importlib.abc
    import importlib.util
    import os
    import sys

    _here = os.path.dirname(os.path.abspath(__file__))

    def _chain_previous() -> None:
        """Import the sitecustomize that ours shadows, if there is one, and leave it in place.

        The user's module stays ``sys.modules["sitecustomize"]``: it must outlive this call
        (what it registered, e.g. ``torch.library`` ops held in its globals, dies with it) and
        be what ``import sitecustomize`` finds. Ours is kept under a name of its own."""
        saved_path = list(sys.path)
        ours = sys.modules.pop("sitecustomize", None)
        theirs = None
        try:
            sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
            spec = importlib.util.find_spec("sitecustomize")
            if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != _here:
                import sitecustomize  # the user's own; its errors are its own
                theirs = sitecustomize
        except Exception:
            theirs = sys.modules.get("sitecustomize")  # half-run: keep what it did
        finally:
            sys.path[:] = saved_path
            if ours is not None:
                sys.modules["_flowtop_sitecustomize"] = ours
                if theirs is None:
                    sys.modules["sitecustomize"] = ours

    class _AttachAfterOptim(importlib.abc.MetaPathFinder):
        """Waits for ``torch.optim`` to finish importing, then attaches the probe."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch.optim":
                return None
            try:
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                if spec is None or spec.loader is None:
                    return spec
                loader = spec.loader
                original = loader.exec_module

                def exec_module(module):
                    original(module)  # the user's import: its errors are the user's
                    _attach_on_first_optimizer(module)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
            except Exception:  # runs inside the user's `import torch`: never break it
                return None

    def _attach_on_first_optimizer(optim_module) -> None:
        """Attach when the first optimizer is built: torch is fully imported by then,
        the model exists, its first forward is still ahead, and processes that never
        train (torchrun's agent, tools) never attach. The probe's own deferred attach does it
        (the one an explicit attach() in a spawn child uses too: one patch, not two)."""
        try:
            import probe

            probe._defer_to_first_optimizer(probe._AttachArgs(), optim_module.Optimizer)
        except Exception:
            pass

    # probe.config.DISABLE, read here without importing the probe: this runs at the start of
    # every interpreter of the job (a test keeps these spellings equal to config.TRUE_WORDS).
    if os.environ.get("FLOWTOP_DISABLE", "").strip().lower() not in ("1", "true", "yes", "on"):
        if "torch.optim" in sys.modules:
            _attach_on_first_optimizer(sys.modules["torch.optim"])
        else:
            sys.meta_path.insert(0, _AttachAfterOptim())
    _chain_previous()
except Exception:  # a guest never raises
    pass
