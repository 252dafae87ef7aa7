"""One job at a time per output folder: an exclusive lock file beside the part files.

``_acare_job.lock`` (readers skip files starting with ``_``) holds JSON naming its holder:
``run_id``, ``host``, ``pid``, ``since`` and the command line. A job takes it before it
looks at the folder (manifest, incomplete files, errored rows, done set) and removes it when
it ends, however it ends, so a second job on the same output can neither delete the first
one's files nor write the same searches again.

- **Local disks and NFS** (a plain path): created with ``O_CREAT | O_EXCL``, which is atomic
  on local file systems and on NFSv3 and later: of two jobs exactly one gets it.
- **Object stores** (``s3://``, ``gs://``): no exclusive create through pyarrow; the lock is
  written if absent and read back to check it is ours. That catches a second job started
  after the first took the lock, not two started in the same instant: run one job per output
  from whatever schedules them.
- **Stale locks.** A job killed with SIGKILL, or a node that died, leaves its lock behind.
  A lock held by a process on this host that no longer exists is taken over (with a warning).
  Any other lock makes the job fail with :class:`OutputLocked`, whose message names the holder;
  once sure that job is gone, delete the lock file and run again.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import sys
import time
from typing import Any

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

LOCK_FILE = "_acare_job.lock"


class OutputLocked(RuntimeError):
    """Another job holds the output folder's lock; the message names it."""


def _holder(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLock:
    """The lock of the folder ``root`` on ``fs`` for run ``run_id``; a context manager.

    ``acquire`` raises :class:`OutputLocked` when another live job holds it; ``release``
    removes the file only while it still names this run.
    """

    def __init__(self, fs: pafs.FileSystem, root: str, run_id: str) -> None:
        self.fs, self.root, self.run_id = fs, root, run_id
        self.path = posixpath.join(root, LOCK_FILE)
        self.held = False

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.fs.create_dir(self.root, recursive=True)
        payload = json.dumps(_holder(self.run_id), indent=2).encode("utf-8")
        for _ in range(2):
            if self._create(payload):
                self.held = True
                return
            holder = self.read()
            if holder is None:  # released between our create and our read: try again
                continue
            if not self._stale(holder):
                raise OutputLocked(self._message(holder))
            log.warning("taking over the stale lock %s of a dead process: %s", self.path, holder)
            self.fs.delete_file(self.path)
        raise OutputLocked(self._message(self.read()))

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        if (self.read() or {}).get("run_id") == self.run_id:
            self.fs.delete_file(self.path)
        else:
            log.warning("lock %s no longer names run %s; left as it is", self.path, self.run_id)

    def read(self) -> dict[str, Any] | None:
        """The holder recorded in the lock file, None when there is none (or it is garbled)."""
        try:
            with self.fs.open_input_stream(self.path) as f:
                return json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {}

    def _create(self, payload: bytes) -> bool:
        if isinstance(self.fs, pafs.LocalFileSystem):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            return True
        if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
            return False
        with self.fs.open_output_stream(self.path) as f:
            f.write(payload)
        return (self.read() or {}).get("run_id") == self.run_id

    def _stale(self, holder: dict[str, Any]) -> bool:
        pid = holder.get("pid")
        same_host = holder.get("host") == socket.gethostname()
        return same_host and isinstance(pid, int) and not _alive(pid)

    def _message(self, holder: dict[str, Any] | None) -> str:
        who = (
            f"run {holder.get('run_id')} (pid {holder.get('pid')} on {holder.get('host')}, "
            f"since {holder.get('since')}: {holder.get('command')})"
            if holder
            else "an unknown job (the lock file is empty or garbled)"
        )
        return (
            f"output {self.root} is locked by {who}; another job is writing it. Wait for it "
            f"to end, or, if it is dead, delete {self.path} and run again"
        )
