"""numba's on-disk cache of lpsim's kernels, invalidated when any lpsim source changes.

numba stamps a cached kernel with its own source file only.  A kernel in
lpsim/blocks/kernels.py compiles lpsim/rounding.py's decision into itself, so after an edit
of rounding.py numba would load the old blocks kernel, silently, with the old decision.
Here each kernel's stamp is its file's (numba's own) plus the (path, mtime, size) of every
source file of lpsim and lpsim_cuda (subpackages included), so a change anywhere recompiles
everything once.  A fresh install changes every file, so this matters most to whoever edits
lpsim (an editable install) and to processes sharing one cache directory across versions.

It works through numba's cache locators (``numba.core.caching.CacheImpl``): each locator
that backs a cache with a source file gets an lpsim twin that answers for lpsim's files
only.  Imported first by ``lpsim/__init__.py``, before any kernel is declared.  Where numba
lacks that interface (another version) nothing is installed and numba's stamps apply.

Processes sharing the cache (DDP ranks, pytest-xdist workers, a pool) compile a kernel once
between them: an lpsim kernel compiles holding an exclusive POSIX record lock
(``fcntl.lockf``) on a file beside its cache entry (per kernel and signature), so a process
that wants the same kernel meanwhile waits and then loads what the first one saved.  A
record lock is the process's own: a child forked meanwhile (a DataLoader worker) holds no
copy of it (an ``flock``'s would keep it until the child exits).  The OS drops the lock of a
process that dies; after COMPILE_LOCK_WAIT seconds a waiter compiles anyway; where locks are
unavailable (no fcntl, a read-only cache) kernels compile as before.
``LPSIM_COMPILE_LOCK=0`` turns the locks off.

A cache entry that cannot be read back (a truncated file: a full disk, a killed writer) is
dropped from its index and the kernel compiled again, with a warning naming the folder.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import time
import traceback
import warnings

PACKAGES = ("lpsim", "lpsim_cuda")


def package_dirs() -> tuple[str, ...]:
    """The source directories of lpsim and lpsim_cuda (lpsim_cuda's where it sits beside)."""
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here]
    sibling = os.path.join(os.path.dirname(here), "lpsim_cuda")
    if os.path.isdir(sibling):
        dirs.append(sibling)
    return tuple(dirs)


def source_stamp(dirs) -> tuple:
    """(relative path, mtime in ns, size) of every .py file under ``dirs``, sorted."""
    stamp = []
    for root in dirs:
        base = os.path.dirname(root)
        for folder, subdirs, files in os.walk(root):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    st = os.stat(path)
                    stamp.append((os.path.relpath(path, base), st.st_mtime_ns, st.st_size))
    return tuple(stamp)


@functools.cache
def package_stamp() -> tuple:
    """:func:`source_stamp` of lpsim's sources, taken once per process (as numba hashes a
    kernel's file once)."""
    return source_stamp(package_dirs())


def _in_package(py_file) -> bool:
    path = os.path.abspath(py_file)
    return any(path.startswith(d + os.sep) for d in package_dirs())


def _lpsim_locator(base):
    """A subclass of numba's locator ``base`` for lpsim's files, stamped by the package."""
    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if not _in_package(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return (super().get_source_stamp(), package_stamp())

    Locator.__name__ = Locator.__qualname__ = f"Lpsim{base.__name__}"
    return Locator


def install() -> bool:
    """Put lpsim's locators in front of numba's; True when installed (idempotent)."""
    try:
        from numba.core import caching
        impl = caching.CacheImpl
        mixin = caching._SourceFileBackedLocatorMixin
        classes = impl._locator_classes
    except (ImportError, AttributeError):
        return False
    if any(getattr(cls, "__name__", "").startswith("Lpsim") for cls in classes):
        return True
    ours = [_lpsim_locator(cls) for cls in classes
            if isinstance(cls, type) and issubclass(cls, mixin)]
    classes[:0] = ours
    return True


#: seconds a process waits for another's compile of the same kernel before compiling itself
COMPILE_LOCK_WAIT = 300.0


def _lock_path(dispatcher, sig):
    """The lock file of an lpsim kernel's cache entry for ``sig`` (None: not an lpsim kernel
    with an on-disk cache)."""
    cache = getattr(dispatcher, "_cache", None)
    impl = getattr(cache, "_impl", None)
    locator = getattr(impl, "locator", None)
    if locator is None or not type(locator).__name__.startswith("Lpsim"):
        return None
    key = hashlib.sha1(str(sig).encode()).hexdigest()[:16]
    return os.path.join(cache._cache_path, f"{impl.filename_base}.{key}.lock")


def _acquire(path):
    """An open descriptor holding an exclusive lock on ``path``, or None (no lock to be had
    within COMPILE_LOCK_WAIT seconds, or none available here)."""
    try:
        import fcntl
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o666)
    except (ImportError, OSError):
        return None
    deadline = time.monotonic() + COMPILE_LOCK_WAIT
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EAGAIN) or \
                    time.monotonic() > deadline:
                break                   # no locks here, or waited long enough
            time.sleep(0.02)
    os.close(fd)
    return None


def _locked(compile_):
    """Dispatcher.compile holding the kernel's lock, inside numba's compiler lock (so that
    the threads of one process never wait on each other's file locks)."""
    from numba.core.compiler_lock import global_compiler_lock

    @functools.wraps(compile_)
    def compile(self, sig):
        path = _lock_path(self, sig)
        if path is None or os.environ.get("LPSIM_COMPILE_LOCK", "1") == "0":
            return compile_(self, sig)
        with global_compiler_lock:
            fd = _acquire(path)
            try:
                return _loaded_or_compiled(compile_, self, sig)   # loads what another
            finally:                                               # process saved meanwhile
                if fd is not None:
                    os.close(fd)               # closing releases the lock
    compile.lpsim_locked = True
    return compile


def _loaded_or_compiled(compile_, dispatcher, sig):
    """``compile_(dispatcher, sig)``; where reading the cache entry fails (numba raises the
    unpickling error of a truncated file on every later call), the kernel's index is emptied
    and it is compiled again (and saved anew)."""
    try:
        return compile_(dispatcher, sig)
    except Exception as error:
        frames = traceback.extract_tb(error.__traceback__)
        if not any(frame.filename.endswith(_CACHING) for frame in frames):
            raise
        cache = dispatcher._cache
        warnings.warn(f"lpsim: the cache entry of {dispatcher.__name__} in "
                      f"{getattr(cache, '_cache_path', '?')} could not be read "
                      f"({type(error).__name__}); it is dropped and the kernel compiled again",
                      RuntimeWarning, stacklevel=3)
        cache.flush()                   # an empty index: the next load misses
        return compile_(dispatcher, sig)


#: numba's cache module, whose frames mark an error as the cache's
_CACHING = os.path.join("numba", "core", "caching.py")


def install_compile_locks() -> bool:
    """Wrap numba's Dispatcher.compile with the per-kernel lock (idempotent)."""
    try:
        from numba.core.dispatcher import Dispatcher
    except ImportError:
        return False
    if not getattr(Dispatcher.compile, "lpsim_locked", False):
        Dispatcher.compile = _locked(Dispatcher.compile)
    return True


INSTALLED = install() and install_compile_locks()
