"""The one way this project retries a call that may fail for a while (a server not up yet,
an actor being restarted, an upload to a busy store): tenacity, configured here.

Callers keep their own error message: the last exception is re-raised unchanged once the
time or the attempts are used up, and the caller turns it into its one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import tenacity

T = TypeVar("T")


def call_with_retries(
    call: Callable[[], T],
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    timeout_s: float | None = None,
    attempts: int | None = None,
    wait_s: float = 0.5,
    max_wait_s: float | None = None,
) -> T:
    """``call()``, called again while it raises ``retry_on``.

    Args:
        call: the zero-argument call to make.
        retry_on: the exception type(s) that mean "not yet"; any other exception propagates
            at once.
        timeout_s: stop retrying once this many seconds have passed since the first call.
        attempts: stop after this many calls. At least one of ``timeout_s`` and ``attempts``
            must be given.
        wait_s: pause before the second call.
        max_wait_s: when given, each pause doubles up to this (exponential backoff);
            otherwise every pause is ``wait_s``.

    Returns:
        What ``call()`` returned on the first call that did not raise.

    Raises:
        The last ``retry_on`` exception, unchanged, when the time or attempts are used up.
    """
    if timeout_s is None and attempts is None:
        raise ValueError("call_with_retries needs timeout_s or attempts")
    stops = []
    if timeout_s is not None:
        stops.append(tenacity.stop_after_delay(max(0.0, timeout_s)))
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    wait = (
        tenacity.wait_exponential(multiplier=wait_s, min=wait_s, max=max_wait_s)
        if max_wait_s is not None
        else tenacity.wait_fixed(wait_s)
    )
    retrying = tenacity.Retrying(
        stop=tenacity.stop_any(*stops),
        wait=wait,
        retry=tenacity.retry_if_exception_type(retry_on),
        reraise=True,
    )
    return retrying(call)
