"""The one exception type whose message is shown to users as a one-line error.

It lives in the bottom layer because every layer raises it: environments, the core of ``trace_ray``,
the actors and the command line, which prints its message and exits non-zero.
"""


class TraceRayError(Exception):
    """A user-facing failure: the message names the cause and the fix, on one line."""
