"""What file system holds the store: a local disk, or one shared over the network.

SQLite's WAL mode keeps its index in shared memory (the ``-shm`` file, mapped by every
connection), which works only when every connection is on one host, and POSIX locks over NFS
are unreliable: SQLite's documentation ("WAL mode", "SQLite over a network") says not to use
a database on a network file system from several hosts.  Jobs on other hosts therefore never
write the store (:mod:`scalectl.store.journal`); this module tells a network file system apart
by the type ``statfs(2)`` reports (``f_type``, the magic numbers of ``linux/magic.h``),
with ``/proc/self/mountinfo`` naming the type where ``statfs`` cannot be called and naming
the daemon behind a FUSE mount (``fuse.sshfs``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

#: ``statfs`` f_type -> name, for file systems shared between hosts (network or cluster).
NETWORK_MAGIC: dict[int, str] = {
    0x6969: "nfs", 0x517B: "smb", 0xFF534D42: "cifs", 0xFE534D42: "smb2", 0x73757245: "coda",
    0x5346414F: "afs", 0x6B414653: "afs", 0x00C36400: "ceph", 0x0BD00BD0: "lustre",
    0x47504653: "gpfs", 0x01021997: "9p", 0x19830326: "beegfs", 0xAAD7AAEA: "panfs",
    0x20030528: "orangefs", 0x7461636F: "ocfs2", 0x01161970: "gfs2",
}
#: ``statfs`` f_type -> name, for some local file systems (to name them in messages).
LOCAL_MAGIC: dict[int, str] = {
    0xEF53: "ext4", 0x58465342: "xfs", 0x9123683E: "btrfs", 0x01021994: "tmpfs",
    0x794C7630: "overlay", 0x2FC12FC1: "zfs", 0x73717368: "squashfs", 0x4D44: "vfat",
}
FUSE_MAGIC = 0x65735546
#: mountinfo type names (and FUSE subtypes) of network or cluster file systems.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "lustre", "gpfs", "9p", "afs", "beegfs",
    "panfs", "orangefs", "pvfs2", "ocfs2", "gfs2", "glusterfs", "coda", "fuse.sshfs", "fuse.glusterfs",
    "fuse.ceph-fuse", "fuse.s3fs", "fuse.gcsfuse", "fuse.rclone", "fuse.juicefs", "fuse.beegfs",
})


@dataclass(frozen=True)
class FileSystem:
    """The file system holding a path.

    Attributes:
        name: its type (``nfs``, ``lustre``, ``ext4``, ``fuse.sshfs``, ...; ``unknown`` when
            neither statfs nor mountinfo tells).
        network: shared over the network or between hosts (or a FUSE mount, whose daemon may
            be anywhere): the store there is never written by jobs.
        source: how it was found: ``statfs`` or ``mountinfo``, or ``none``.
    """

    name: str
    network: bool
    source: str


def _existing(path: str | Path) -> str:
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return str(p)


def statfs_type(path: str | Path) -> int | None:
    """``statfs(2)``'s ``f_type`` of ``path`` (Linux), or None where it cannot be called."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name or not hasattr(os, "uname") or os.uname().sysname != "Linux":
        return None
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        buf = ctypes.create_string_buffer(512)        # struct statfs: f_type (a long) comes first
        if libc.statfs(os.fsencode(str(path)), buf) != 0:
            return None
        return ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None


def mount_type(path: str | Path, mountinfo: str | None = None) -> str | None:
    """The type (``nfs4``, ``ext4``, ``fuse.sshfs``) of the mount holding ``path``, from
    ``/proc/self/mountinfo`` (or the text ``mountinfo``): the longest mount point that
    contains it.  None when there is no such file or no mount matches."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best, kind = -1, None
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), right.split()[0]
    return kind


def file_system(path: str | Path) -> FileSystem:
    """The file system holding ``path`` (or its nearest existing parent folder)."""
    where = _existing(path)
    magic = statfs_type(where)
    if magic is not None and magic != FUSE_MAGIC:
        if magic in NETWORK_MAGIC:
            return FileSystem(NETWORK_MAGIC[magic], True, "statfs")
        return FileSystem(LOCAL_MAGIC.get(magic, mount_type(where) or f"0x{magic:x}"), False, "statfs")
    kind = mount_type(where)
    if kind is None:
        return FileSystem("fuse" if magic == FUSE_MAGIC else "unknown", magic == FUSE_MAGIC, "statfs" if magic else "none")
    return FileSystem(kind, kind in NETWORK_TYPES or kind.startswith("fuse") or magic == FUSE_MAGIC, "mountinfo")
