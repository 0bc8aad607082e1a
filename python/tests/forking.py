"""Running part of a test in a forked child, as a worker forked from an engine would."""

from __future__ import annotations

import os
import traceback
from typing import Callable


def status_in_fork(body: Callable[[], None]) -> int:
    """Runs ``body`` in a child made by ``os.fork`` and returns the child's exit status: 0
    when ``body`` returned, 1 when it raised (the traceback goes to stderr). The child
    leaves with ``os._exit``, so none of the parent's clean-up runs twice."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
