"""Worker identities that a process on the same host can check for liveness.

A lease names its holder by an owner string. A worker identity made here carries,
besides the host name and the pid, what makes the holder checkable from another
process of the same host: the boot id (a pid means nothing across reboots), the pid
namespace (containers sharing a kernel and a host name still have their own pids)
and the process's start time in clock ticks since boot (a pid is reused once its
process is gone). With those, a lease whose holder is a process of this host that no
longer exists, or whose pid now belongs to another process, is known dead at once,
instead of after its time to live. Identities of other hosts, and owner strings
chosen by the user, cannot be checked from here: their leases keep the TTL and
heartbeat.

The owner string stays readable: ``host:pid:nonce@boot.pidns.start``, for example
``api-7:4242:1f9c2a@3b0d8e6f1a2c.4026531836.918273``. Without ``/proc`` (macOS,
Windows) the identity is ``host:pid:nonce``, which is never judged dead early.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from langgraph_cancel.types import LeaseRecord, utcnow

__all__ = ["WorkerIdentity", "holder_is_gone", "lease_is_live", "new_worker_id"]

_PROC = Path("/proc")
_BOOT_ID_CHARS = 12
_DEAD_STATES = frozenset({"Z", "X", "x"})

_OWNER_PATTERN = re.compile(
    r"^(?P<host>[^:@]+):(?P<pid>\d+):(?P<nonce>[0-9a-f]+)"
    r"@(?P<boot>[0-9a-f]+)\.(?P<pidns>\d+)\.(?P<start>\d+)$"
)


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Who holds a lease, in a form a process of the same host can check.

    Attributes:
        host: The host name (``socket.gethostname()``).
        pid: The process id, in the process's pid namespace.
        nonce: Random hex: two workers of one process (or a fork) never share an owner.
        boot_id: The first hex digits of the kernel's boot id: a pid is only
            meaningful within one boot.
        pid_namespace: The inode of the process's pid namespace: pids are only
            comparable within one namespace.
        start_ticks: The process's start time in clock ticks since boot (field 22 of
            ``/proc/PID/stat``): it tells a process from a later one with its pid.
    """

    host: str
    pid: int
    nonce: str
    boot_id: str
    pid_namespace: int
    start_ticks: int

    @property
    def owner(self) -> str:
        """The owner string a lease and an effect record carry."""
        return (
            f"{self.host}:{self.pid}:{self.nonce}"
            f"@{self.boot_id}.{self.pid_namespace}.{self.start_ticks}"
        )

    @classmethod
    def parse(cls, owner: str) -> WorkerIdentity | None:
        """The identity an owner string spells, or None when it is not checkable."""
        match = _OWNER_PATTERN.match(owner)
        if match is None:
            return None
        return cls(
            host=match["host"],
            pid=int(match["pid"]),
            nonce=match["nonce"],
            boot_id=match["boot"],
            pid_namespace=int(match["pidns"]),
            start_ticks=int(match["start"]),
        )


def new_worker_id() -> str:
    """A fresh worker identity for this process (checkable where ``/proc`` exists)."""
    host = socket.gethostname()
    pid = os.getpid()
    nonce = uuid.uuid4().hex[:6]
    here = _this_host()
    start = _start_ticks(pid)
    if here is None or start is None:
        return f"{host}:{pid}:{nonce}"
    boot_id, pid_namespace = here
    return WorkerIdentity(host, pid, nonce, boot_id, pid_namespace, start).owner


def holder_is_gone(owner: str) -> bool:
    """True when ``owner`` is a process of this host that no longer runs.

    Only a holder of this very host (same host name, same boot, same pid namespace)
    can be judged: then it is gone when its pid does not exist or belongs to a
    process that started at another time. Anything else (another host, an owner
    string chosen by the user, no ``/proc``) is never judged gone here.
    """
    holder = WorkerIdentity.parse(owner)
    if holder is None or holder.host != socket.gethostname():
        return False
    here = _this_host()
    if here is None or here != (holder.boot_id, holder.pid_namespace):
        return False
    start = _start_ticks(holder.pid)
    return start != holder.start_ticks


def lease_is_live(lease: LeaseRecord | None) -> bool:
    """True when a worker holds the lease: it has not expired and its holder is not
    known to be gone (a process of this host that no longer runs)."""
    return lease is not None and lease.expires_at > utcnow() and not holder_is_gone(lease.owner)


@cache
def _this_host() -> tuple[str, int] | None:
    """This process's boot id prefix and pid namespace inode, when ``/proc`` has them."""
    try:
        boot_id = (_PROC / "sys/kernel/random/boot_id").read_text().strip().replace("-", "")
        pid_namespace = os.stat(_PROC / "self/ns/pid").st_ino
    except OSError:
        return None
    return boot_id[:_BOOT_ID_CHARS], pid_namespace


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; None if it is gone.

    A zombie (killed, not yet waited for by its parent) counts as gone: it runs no
    code and will never heartbeat again.
    """
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': the
    # fields after it start at the last ')'. The state is field 3, starttime field 22.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in _DEAD_STATES:
        return None
    return int(fields[19])
