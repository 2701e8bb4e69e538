"""A file system that passes every call through to a directory, and fails syncs on command.

Usage: faultfs.py BACKING MOUNTPOINT CONTROL (as root; needs fusepy and libfuse2). Runs in
the foreground until unmounted. While the file CONTROL says `fail`, every fsync and fdatasync
fails with EIO, as on a disk whose writes the kernel could not complete; while it says
`hold`, every write and sync waits (printing `held` on stdout as it starts waiting) until it
says something else, as on a disk that has stalled (writes too, since some stores sync with
sync_file_range, which FUSE never sees); anything else in it heals the disk. Reads, opens and
every other call still work while a write waits: libfuse serves each call on its own thread
(a single-threaded daemon would queue them all behind the held write). So what fails is exactly
the sync: the case where Linux may already have dropped the pages it could not write, and a
second sync would report success for data that never reached the disk. The file is read at
every sync, so a change applies to the very next one.

The Rust side is tests/src/disks.rs.
"""
import errno
import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations

CONTROL = None


def control():
    try:
        with open(CONTROL) as control:
            return control.read().strip()
    except FileNotFoundError:
        return ""


def wait_while_held():
    if control() == "hold":
        print("held", flush=True)
        while control() == "hold":
            time.sleep(0.01)


def syncs_fail():
    """Waits while the disk is held; then whether syncs fail."""
    wait_while_held()
    return control() == "fail"


class Passthrough(Operations):
    def __init__(self, root):
        self.root = os.path.realpath(root)

    def _path(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def __call__(self, op, path, *args):
        try:
            return super().__call__(op, self._path(path), *args)
        except OSError as error:
            raise FuseOSError(error.errno or errno.EIO)

    def access(self, path, mode):
        if not os.access(path, mode):
            raise FuseOSError(errno.EACCES)

    def chmod(self, path, mode):
        os.chmod(path, mode)

    def chown(self, path, uid, gid):
        os.chown(path, uid, gid)

    def create(self, path, mode, fi=None):
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def flush(self, path, fh):
        return 0

    def fsync(self, path, datasync, fh):
        if syncs_fail():
            raise FuseOSError(errno.EIO)
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def fsyncdir(self, path, datasync, fh):
        if syncs_fail():
            raise FuseOSError(errno.EIO)
        return 0

    def getattr(self, path, fh=None):
        st = os.lstat(path)
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink",
                "st_size", "st_uid", "st_blocks")
        return {key: getattr(st, key) for key in keys}

    def link(self, target, source):
        return os.link(self._path(source), target)

    def mkdir(self, path, mode):
        return os.mkdir(path, mode)

    def open(self, path, flags):
        return os.open(path, flags)

    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(path)

    def readlink(self, path):
        return os.readlink(path)

    def release(self, path, fh):
        return os.close(fh)

    def rename(self, old, new):
        return os.rename(old, self._path(new))

    def rmdir(self, path):
        return os.rmdir(path)

    def statfs(self, path):
        sv = os.statvfs(path)
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                "f_files", "f_flag", "f_frsize", "f_namemax")
        return {key: getattr(sv, key) for key in keys}

    def symlink(self, target, source):
        return os.symlink(source, target)

    def truncate(self, path, length, fh=None):
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(path, length)

    def unlink(self, path):
        return os.unlink(path)

    def utimens(self, path, times=None):
        return os.utime(path, times)

    def write(self, path, data, offset, fh):
        wait_while_held()
        return os.pwrite(fh, data, offset)


def end_with_parent():
    """Asks for SIGTERM when the test that started this ends, however it ends: libfuse then
    unmounts and exits, so no mount is left behind."""
    import ctypes
    import signal
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


if __name__ == "__main__":
    backing, mountpoint, CONTROL = sys.argv[1], sys.argv[2], sys.argv[3]
    end_with_parent()
    FUSE(Passthrough(backing), mountpoint, foreground=True, nothreads=False)
