"""The local executor's jobs, as the scheduler layer sees them: which process is whose, and what state
each job is in. ``harness.campaign.executors.local`` starts them; status, cancel, ``submit --wait`` and collect
ask here.

**Process identity.** A pid written in a file of the work dir (``submitted.json``, a queue's pidfile) names
a process; it never vouches for it. Every launch (the process that becomes the job's node runner) and every
queue process carries ``SBENCH_LOCAL_TOKEN`` in its environment: an HMAC of its job dir (or queue file)
under a key of this user that lives outside every work dir (:func:`harness.contract.paths.process_key_files`,
mode 0600). A process is trusted only when ``/proc/<pid>/environ`` carries the value computed here from
the path alone; nothing is taken from the file that names the pid. A pid reused by another process, a
process someone else started, or a forged file naming a process of this user: none carries the value.

**States** (:mod:`harness.contract.jobstate`), from ``submitted.json`` and the processes:

- ``COMPLETED`` / ``FAILED`` / ``CANCELLED``: the launch ended and recorded its exit;
- ``RUNNING``: its launch process is alive and verified;
- ``LOST``: it started, and its process is gone without recording an end (the files decide its outcome);
- ``PENDING``: not started yet, and the queue that holds it is alive (verified);
- ``CANCELLED`` without an end: ``sbench cancel`` marked it before it started;
- ``NOT_STARTED``: not started, and its queue is gone (killed, or the submit that made it was stopped),
  and no node runner left a stage log there;
- ``UNKNOWN``: a job dir of another user whose process this user cannot inspect.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import hmac
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from harness.contract import envvars, safefile
from harness.contract.errors import SbenchError
from harness.contract.paths import CampaignPaths, JobPaths, process_key_files
from harness.contract.records import SubmittedInfo, read_submitted, write_submitted

LAUNCH = "launch"
QUEUE = "queue"
MAX_BYTES = 1 << 20  # pidfiles and the campaign lock are a few hundred bytes
# /proc/<pid>/environ reads empty for an instant while the process execs: read it again, this often.
EMPTY_READS = 10


# -- the key and the tokens ------------------------------------------------------------------------------
def _load_key(path: Path) -> bytes | None:
    """This user's key at *path*, made there if absent; None when the place is unusable (not ours, too open)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        pst = path.parent.stat()
        if pst.st_uid != os.getuid() or pst.st_mode & 0o022:
            return None
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_hex(32).encode())
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # atomic, and never over a key another process just made
            except FileExistsError:
                pass
            finally:
                tmp.unlink()
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
                return None
            key = os.read(fd, 256).strip()
        finally:
            os.close(fd)
    except OSError:
        return None
    return key if len(key) >= 32 else None


@functools.lru_cache(maxsize=1)
def process_key() -> bytes:
    """This user's key for process tokens (made on first use)."""
    tried = process_key_files()
    for path in tried:
        key = _load_key(path)
        if key is not None:
            return key
    raise SbenchError(f"cannot keep a private key for local process tokens in {' or '.join(map(str, tried))}: "
                      "each must be a directory of yours, not writable by others (set XDG_CACHE_HOME to one)")


def token(kind: str, path: str | Path) -> str:
    """The token a *kind* (``launch`` or ``queue``) process of *path* carries in its environment."""
    msg = f"{kind}\0{os.path.abspath(path)}".encode()
    return hmac.new(process_key(), msg, hashlib.sha256).hexdigest()[:40]


def environment(kind: str, path: str | Path) -> dict[str, str]:
    """The variables to add to a *kind* process's environment for *path*."""
    return {envvars.LOCAL_TOKEN.name: token(kind, path)}


def carries(pid: Any, kind: str, path: str | Path) -> bool | None:
    """Whether process *pid* is alive and carries *path*'s token; None when it is alive but this user may not
    read its environment (another user's process)."""
    expected = token(kind, path)
    for _ in range(EMPTY_READS):
        try:
            proc = psutil.Process(int(pid))
            if proc.status() == psutil.STATUS_ZOMBIE:
                return False
            env = proc.environ()
        except (TypeError, ValueError, psutil.NoSuchProcess):
            return False
        except psutil.AccessDenied:
            return None
        except psutil.Error:
            return False
        if env:
            return hmac.compare_digest(env.get(envvars.LOCAL_TOKEN.name, ""), expected)
        time.sleep(0.05)  # read while the process was exec'ing (the launch execs bash, then the node runner)
    return False


def verified(pid: Any, kind: str, path: str | Path) -> psutil.Process | None:
    """The process *pid* if it is *path*'s own *kind* process (see :func:`carries`), else None."""
    if carries(pid, kind, path) is not True:
        return None
    try:
        return psutil.Process(int(pid))
    except psutil.Error:
        return None


# -- files -----------------------------------------------------------------------------------------------
def read_json(path: str | Path, root: str | Path) -> dict[str, Any]:
    """A small JSON object file inside *root*, read as :mod:`harness.contract.safefile` reads (a FIFO or a
    device is not read, a link is followed only inside *root*, within a bound); {} otherwise."""
    try:
        doc = safefile.read_json(path, root, MAX_BYTES)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@contextlib.contextmanager
def job_lock(job_dir: str | Path) -> Iterator[None]:
    """Hold the job dir's lock (flock on the directory itself) while ``submitted.json`` is read and rewritten:
    the queue, the launch and cancel each decide on what they read there. Where the file system refuses
    locks on directories the block runs unlocked."""
    try:
        fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in (errno.ENOLCK, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF):
                raise
        yield
    finally:
        os.close(fd)


# what a job's submitted.json holds once it will never start (again): started, ended, cancelled, not started
SETTLED = ("pid", "ended_at", "cancelled_at", "not_started_at")


def update_submitted(job_dir: str | Path, fields: SubmittedInfo, unless: tuple[str, ...] = ()) -> SubmittedInfo:
    """Merge *fields* into the job's ``submitted.json`` under its lock, unless it already has one of the
    fields *unless*; returns what the file holds afterwards."""
    with job_lock(job_dir):
        info = read_submitted(job_dir)
        if not any(info.get(k) for k in unless):
            info.update(fields)
            write_submitted(job_dir, info)
        return info


# -- states ----------------------------------------------------------------------------------------------
def queue_alive(queue_file: str | Path | None) -> bool | None:
    """Whether the queue process of *queue_file* runs (None: another user's, so this user cannot tell)."""
    if not queue_file:
        return False
    # A queue's files lie in its campaign's CampaignPaths.local: the pidfile is read inside that campaign directory.
    doc = read_json(CampaignPaths.queue_pidfile(queue_file), CampaignPaths.of_queue(queue_file).root)
    return carries(doc.get("pid"), QUEUE, queue_file)


def _foreign(job_dir: str | Path) -> bool:
    try:
        return os.stat(job_dir).st_uid != os.getuid()
    except OSError:
        return False


def job_state(job_dir: str | Path, info: SubmittedInfo | None = None) -> str | None:
    """The state of the local job in *job_dir* (module docstring); None when it has no ``submitted.json``."""
    info = read_submitted(job_dir) if info is None else info
    if not info:
        return None
    if info.get("ended_at"):
        if info.get("exit_code") == 0:
            return "COMPLETED"
        return "CANCELLED" if info.get("cancelled_at") else "FAILED"
    if info.get("pid"):
        alive = carries(info["pid"], LAUNCH, job_dir)
        if alive is True:
            return "RUNNING"
        if alive is None and _foreign(job_dir):
            return "UNKNOWN"
        return "LOST"
    if info.get("cancelled_at"):
        return "CANCELLED"
    if info.get("not_started_at"):
        return "NOT_STARTED"
    queue = info.get("queue")
    # Handed to the queue's job process, which has not started the launch yet: that process carries the
    # queue's token (it inherits the queue's environment).
    if queue and info.get("job_id") and carries(info["job_id"], QUEUE, queue):
        return "PENDING"
    alive = queue_alive(queue)
    if alive is True or (alive is None and _foreign(job_dir)):
        return "PENDING"
    # No launch recorded and no queue to start it: not started, unless a node runner left its stage log
    # (a launch that did not record itself: its files decide).
    return "LOST" if JobPaths(job_dir).stage_hosts() else "NOT_STARTED"


__all__ = ["LAUNCH", "QUEUE", "carries", "environment", "job_lock", "job_state", "process_key",
           "queue_alive", "read_json", "token", "verified"]
