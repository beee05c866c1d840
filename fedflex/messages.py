"""Messages both sides build: error replies, and the record names of cohort messages.

The ServerApp side (the grids of :mod:`fedflex.launch`) and the ClientApp side
(:mod:`clients.cohort_app`) share these, so they live in the core, beside
:mod:`fedflex.keys`.
"""

from __future__ import annotations

from flwr.app import Error, Message

ERROR_CLIENT_APP_RAISED = 2  # mirrors Flower's ErrorCode.CLIENT_APP_RAISED_EXCEPTION

#: separates the client id from the record name inside a packed cohort message / reply
SEP = "|"


def error_reply(msg: Message, problem: "Exception | str", code: int = ERROR_CLIENT_APP_RAISED) -> Message:
    """Return the error reply Flower makes for a message whose ClientApp raised ``problem``
    (an exception, or the reason already as text).
    """
    reason = problem if isinstance(problem, str) else f"{type(problem).__name__}: {problem}"
    return Message(Error(code=code, reason=reason), reply_to=msg)


def client_record(client: int, name: str) -> str:
    """Name of client ``client``'s record ``name`` inside a packed reply."""
    return f"{client}{SEP}{name}"


def state_record(client: int, name: str) -> str:
    """Name of client ``client``'s node-state record ``name`` inside a packed message."""
    return f"state{SEP}{client}{SEP}{name}"
