"""One session per pipeline: ``attach``, ``detach``, ``session_of`` and ``call_pipeline``, an
adapter's own ``attach``, ``detach`` and ``run``."""

from __future__ import annotations

import weakref
from typing import Any

from diffaccel.contract.state import RunState

from .session import DenoiserSession


_SESSIONS: "weakref.WeakKeyDictionary[Any, DenoiserSession]" = weakref.WeakKeyDictionary()
"""One table for every diffusers adapter: a pipeline has one diffaccel session, whichever adapter."""
_HINTS: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()
"""Per pipeline: whether its guidance was unbatched (two denoiser calls per step) last time."""


def attach(pipe: Any, accelerator: Any, session_class: type[DenoiserSession]) -> DenoiserSession:
    """Hook ``pipe`` for ``accelerator`` with a new ``session_class`` session (any session the
    pipeline had is detached first); returns it. An adapter's ``attach(pipe, accelerator)``."""
    detach(pipe)
    session = session_class(pipe, accelerator)
    session.unbatched_hint = _HINTS.get(pipe, False)
    session.install()
    _SESSIONS[pipe] = session
    return session


def detach(pipe: Any) -> None:
    """Remove ``pipe``'s session, if any: the pipeline then runs bitwise as if it never had one
    (un-hooked: no wrapper is left in the call path). An adapter's ``detach(pipe)``."""
    session = _SESSIONS.pop(pipe, None)
    if session is not None:
        session.uninstall()
        _HINTS[pipe] = session.unbatched_hint


def session_of(pipe: Any) -> DenoiserSession | None:
    """The session attached to ``pipe``, or None (a peer accelerator must see None: it runs on
    the bare pipeline)."""
    return _SESSIONS.get(pipe)


def call_pipeline(pipe: Any, /, info: dict[str, Any] | None = None, **kwargs: Any) -> tuple[Any, RunState | None]:
    """``pipe(**kwargs)``, with ``info`` (seeds, prompts ...) added to its run's ``run.info``;
    returns the pipeline's result and the ``RunState`` of the run it made (its ``report()`` is
    the output's report), or None when no session is attached (nothing was counted). A run the
    call left open (it raised) is ended. An adapter's ``run`` builds on this."""
    session = _SESSIONS.get(pipe)
    if session is None:
        return pipe(**kwargs), None
    session.last_run = None
    session.next_info = dict(info or {})
    try:
        result = pipe(**kwargs)
    finally:
        if session.run is not None:
            session.end_run()
    return result, session.last_run
