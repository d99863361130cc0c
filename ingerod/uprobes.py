"""Uprobes on library functions, attached as BPF links where the kernel has them.

bcc attaches a uprobe as a perf event, and taking one off waits out kernel grace periods one
probe after another: ~0.1 s a probe here, so an agent with the sim's 69 took 7 to 11 s to stop,
and a node's agent with several users' libraries far longer (systemd's stop timeout, a
restart's gap). Linux 6.6 added uprobe_multi links (BPF_LINK_CREATE with
BPF_TRACE_UPROBE_MULTI): each probe here is a link of one offset, and links closed together
share their grace periods (69 in 0.08 s, measured). Where the kernel refuses them (older than
6.6, or built without), bcc's perf-event uprobes are used as before, decided at the first
attach and said once.

The program must be loaded for the link type (expected attach type BPF_TRACE_UPROBE_MULTI),
which a perf-event uprobe then refuses: the choice is made before any function is loaded.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("ingerod")

SYS_BPF = 321                 # x86-64
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48   # enum bpf_attach_type
BPF_F_UPROBE_MULTI_RETURN = 1
CLOSERS = 32                  # links closed at once


class _UprobeMulti(ctypes.Structure):
    _fields_ = [("path", ctypes.c_uint64), ("offsets", ctypes.c_uint64),
                ("ref_ctr_offsets", ctypes.c_uint64), ("cookies", ctypes.c_uint64),
                ("cnt", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("pid", ctypes.c_uint32)]


class _LinkCreate(ctypes.Structure):
    """union bpf_attr's link_create, as far as uprobe_multi reads it (zero-padded past)."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("uprobe_multi", _UprobeMulti), ("pad", ctypes.c_uint8 * 64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def link_uprobe(prog_fd: int, path: bytes, offset: int, ret: bool) -> int:
    """A uprobe_multi link of one offset in the file at ``path`` (every process); its fd."""
    name = ctypes.create_string_buffer(path)
    offsets = (ctypes.c_uint64 * 1)(offset)
    attr = _LinkCreate(prog_fd=prog_fd, attach_type=BPF_TRACE_UPROBE_MULTI)
    attr.uprobe_multi = _UprobeMulti(path=ctypes.addressof(name),
                                     offsets=ctypes.addressof(offsets), cnt=1,
                                     flags=BPF_F_UPROBE_MULTI_RETURN if ret else 0)
    fd = _libc.syscall(SYS_BPF, BPF_LINK_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return int(fd)


class Uprobes:
    """The uprobes of one bcc ``BPF`` object: attached, taken off, all closed at the end."""

    def __init__(self, bpf):
        self.bpf = bpf
        self.links: dict[tuple[bytes, bytes, bool], int] = {}
        self.as_links: bool | None = None       # decided at the first attach

    def attach(self, path: str, symbol: str, fn_name: str, ret: bool = False) -> None:
        """Probe ``symbol`` of the file at ``path`` (at its entry, or its return); raises
        (bcc's plain Exception) when the file has no such symbol."""
        from bcc import BPF

        name, sym, fn = path.encode(), symbol.encode(), fn_name.encode()
        if self.as_links is not False:
            _module, offset = BPF._check_path_symbol(name, sym, None, -1)
            try:
                program = self.bpf.load_func(fn, BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
                self.links[(name, sym, ret)] = link_uprobe(program.fd, name, offset, ret)
                self.as_links = True
                return
            except Exception as exc:    # OSError from the link; bcc's plain Exception
                if self.as_links or not _unsupported(exc):
                    raise
                self._without_links(fn, exc)
        if ret:
            self.bpf.attach_uretprobe(name=name, sym=sym, fn_name=fn)
        else:
            self.bpf.attach_uprobe(name=name, sym=sym, fn_name=fn)

    def _without_links(self, fn: bytes, exc: Exception) -> None:
        """The kernel has no uprobe_multi links: bcc's perf events from now on."""
        self.as_links = False
        loaded = self.bpf.funcs.pop(fn, None)     # loaded for links: perf events refuse it
        if loaded is not None:
            os.close(loaded.fd)
        log.info("uprobes as perf events (this kernel has no uprobe_multi links: %s); "
                 "stopping takes ~0.1 s a probe", exc)

    def detach(self, path: str, symbol: str, ret: bool = False) -> None:
        key = (path.encode(), symbol.encode(), ret)
        fd = self.links.pop(key, None)
        if fd is not None:
            os.close(fd)
        elif ret:
            self.bpf.detach_uretprobe(name=key[0], sym=key[1])
        else:
            self.bpf.detach_uprobe(name=key[0], sym=key[1])

    def close(self) -> None:
        """Every link closed at once (their grace periods shared); bcc takes its own off."""
        fds, self.links = list(self.links.values()), {}
        with ThreadPoolExecutor(max_workers=CLOSERS) as pool:
            list(pool.map(os.close, fds))


def _unsupported(exc: Exception) -> bool:
    """Whether an attach failed for want of uprobe_multi links, not for the probe itself:
    bcc's load refusing the attach type, or the link call refused (EINVAL, EOPNOTSUPP, ENOSYS,
    EPERM where a policy forbids it)."""
    if isinstance(exc, OSError):
        return exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS, errno.EPERM,
                             errno.ENOTSUP)
    return "Failed to load BPF program" in str(exc)
