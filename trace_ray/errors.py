"""The one exception type whose message is shown to users as a one-line error."""


class TraceRayError(Exception):
    """A user-facing failure: the message names the cause and the fix, on one line."""
