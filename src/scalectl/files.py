"""Reading files a user names: regular files only, within a size limit.

A recipe, setup or import file could be anything a path can name: a folder, a
device such as ``/dev/zero`` (endless), a FIFO (blocks forever), a file of
gigabytes.  :func:`read_limited` opens only regular files and reads at most a
given number of bytes, so every one of these becomes a clear
:class:`~scalectl.errors.UserError` instead of a hang, a traceback or an
exhausted memory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from scalectl.errors import UserError

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def read_limited(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` bytes.

    The file is opened without blocking (a FIFO cannot hang the open) and
    checked on the open descriptor (no race between check and read).

    Args:
        path: the file.
        limit: largest size accepted, in bytes.
        what: what the file is, for the messages ("recipe", "import file").

    Raises:
        UserError: missing, unreadable, not a regular file (folder, device,
            FIFO, socket), or larger than ``limit`` bytes.
    """
    if not str(path):
        raise UserError(f"the {what} path is empty")
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{path}: is {_kind(mode)}, not a {what} (a regular file is needed)")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if len(data) > limit:
        raise UserError(f"{path}: larger than {limit:,} bytes, the limit for a {what}")
    return data


def decode_utf8(path: str | Path, data: bytes) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped).

    Raises:
        UserError: naming the line and the first byte that is not UTF-8.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise UserError(f"{path}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8 text "
                        "(save the file as UTF-8)") from None
