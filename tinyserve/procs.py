"""Small process facts shared by the engine, the frontends and the launcher."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 checks without sending anything)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
