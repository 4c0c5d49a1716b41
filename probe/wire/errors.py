"""The wire's one exception."""


class WireError(ValueError):
    """A frame that cannot be accepted; ``str(err)`` is the reason."""
