"""Process sessions that torchdoctor starts (lab scenarios, loader probes), and how they end.

Every child runs with ``start_new_session=True``, so its session id is its pid and everything it
starts (DataLoader workers, torch_shm_manager, grandchildren) shares that session: these helpers
find and end exactly those processes, never anyone else's.
"""

from __future__ import annotations

import os
import signal

import psutil


def session_members(sid: int) -> list[psutil.Process]:
    members = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid:
                members.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def kill_session(sid: int) -> None:
    """SIGKILL every process in the child's session: all of them were started by this run."""
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in session_members(sid):
        try:
            p.kill()
        except psutil.Error:
            pass


SHM_MANAGER = "torch_shm_manager"
SHM_MANAGER_GRACE = 2.0


def reap_session(sid: int) -> None:
    """Kill what the child left behind, but let torch_shm_manager unlink its segments first.

    The manager removes the ``file_system`` segments of its clients when they disconnect and
    then exits by itself; killing it at once would leave ``/torch_*`` files behind in /dev/shm.
    """
    managers = []
    for p in session_members(sid):
        try:
            if p.name() == SHM_MANAGER:
                managers.append(p)
            else:
                p.kill()
        except psutil.Error:
            continue
    if managers:
        psutil.wait_procs(managers, timeout=SHM_MANAGER_GRACE)
    kill_session(sid)
