"""A shared library's dynamic symbols and their versions: ``nm -D`` where it works, else a small
reader of the ELF file's ``.dynsym`` and version sections. Used by ``bench/real_gpu.py`` on a
lent GPU machine, where binutils may be missing.
"""

from __future__ import annotations

import dataclasses
import struct
import subprocess

NM_TIMEOUT_S = 120         # nm -D over libtorch_cuda.so (a file of a gigabyte or more)
TOOL_TIMEOUT_S = 20        # ldconfig, nvidia-smi

# ELF constants (elf.h) for the fallback reader.
SHT_DYNSYM, SHN_UNDEF = 11, 0
SHT_GNU_VERDEF, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
VER_FLG_BASE, VERSYM_HIDDEN = 1, 0x8000


def command_output(command: list[str], timeout: float = TOOL_TIMEOUT_S) -> str | None:
    """A tool's standard output, or None where it is missing, fails or runs too long."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


@dataclasses.dataclass
class Symbols:
    """A library's dynamic symbols: each defined name with its versioned spellings
    (``cudaLaunchKernel@@libcudart.so.13``), the undefined (imported) names, and the reader."""

    defined: dict[str, list[str]]
    undefined: set[str]
    reader: str


def plain(name: str) -> str:
    return name.split("@", 1)[0]


def nm_names(path: str, which: str) -> list[str] | None:
    """``nm -D --defined-only`` or ``--undefined-only``: the names as nm spells them, with
    their versions; None where nm is missing or fails."""
    out = command_output(["nm", "-D", f"--{which}-only", path], timeout=NM_TIMEOUT_S)
    if out is None:
        return None
    return [line.split()[-1] for line in out.splitlines() if line.split()]


def nm_symbols(path: str) -> Symbols | None:
    """The dynamic symbol table as nm reads it, or None where nm cannot."""
    defined, undefined = nm_names(path, "defined"), nm_names(path, "undefined")
    if defined is None or undefined is None:
        return None
    table: dict[str, list[str]] = {}
    for name in defined:
        table.setdefault(plain(name), []).append(name)
    return Symbols(table, {plain(name) for name in undefined}, "nm")


def c_string(table: bytes, offset: int) -> str:
    end = table.find(b"\0", offset)
    return table[offset:end if end >= 0 else len(table)].decode(errors="replace")


def elf_sections(f, shoff: int, shentsize: int, shnum: int) -> list[tuple[int, ...]]:
    """Each section header as (type, offset, size, link, info); a count of 0 in the file
    header means the real count is in section 0's size (files with 65,280 sections or more)."""
    def header(index: int) -> tuple[int, ...]:
        f.seek(shoff + index * shentsize)
        fields = struct.unpack("<IIQQQQIIQQ", f.read(64))
        return fields[1], fields[4], fields[5], fields[6], fields[7]
    if shnum == 0:
        shnum = header(0)[2]
    return [header(i) for i in range(shnum)]


def read_section(f, section: tuple[int, ...]) -> bytes:
    f.seek(section[1])
    return f.read(section[2])


def elf_version_names(f, sections: list[tuple[int, ...]]) -> tuple[dict[int, str],
                                                                     dict[int, str]]:
    """Version index → name, for definitions (.gnu.version_d, the base entry left out: it is
    the file's own name, not a symbol version) and for needs (.gnu.version_r)."""
    defs: dict[int, str] = {}
    needs: dict[int, str] = {}
    for section in sections:
        kind, link, count = section[0], section[3], section[4]
        if kind not in (SHT_GNU_VERDEF, SHT_GNU_VERNEED):
            continue
        data, strings = read_section(f, section), read_section(f, sections[link])
        at = 0
        for _ in range(count):
            if kind == SHT_GNU_VERDEF:
                _v, flags, index, _cnt, _hash, aux, nxt = struct.unpack_from("<HHHHIII", data, at)
                if not flags & VER_FLG_BASE:
                    defs[index] = c_string(strings, struct.unpack_from("<I", data, at + aux)[0])
            else:
                _v, cnt, _file, aux, nxt = struct.unpack_from("<HHIII", data, at)
                entry = at + aux
                for _ in range(cnt):
                    _hash, _flags, index, name, anext = struct.unpack_from("<IHHII", data, entry)
                    needs[index] = c_string(strings, name)
                    entry += anext
            if not nxt:
                break
            at += nxt
    return defs, needs


def elf_symbols(path: str) -> Symbols:
    """The dynamic symbol table read from the file itself (64-bit little-endian ELF), with
    versions spelled as nm spells them: ``name@@ver`` (default), ``name@ver`` (hidden)."""
    with open(path, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        fields = struct.unpack_from("<HHIQQQIHHHHHH", ident, 16)
        sections = elf_sections(f, fields[5], fields[10], fields[11])
        dynsym = next((s for s in sections if s[0] == SHT_DYNSYM), None)
        if dynsym is None:
            return Symbols({}, set(), "elf")
        strings = read_section(f, sections[dynsym[3]])
        raw = read_section(f, dynsym)
        versym_section = next((s for s in sections if s[0] == SHT_GNU_VERSYM), None)
        versym = read_section(f, versym_section) if versym_section else b""
        defs, needs = elf_version_names(f, sections)
    count = len(raw) // 24
    versions = struct.unpack(f"<{len(versym) // 2}H", versym[:len(versym) // 2 * 2])
    defined: dict[str, list[str]] = {}
    undefined: set[str] = set()
    for i, (name_at, _info, _other, shndx, _value, _size) in enumerate(
            struct.iter_unpack("<IBBHQQ", raw[:count * 24])):
        name = c_string(strings, name_at)
        if i == 0 or not name:
            continue
        version = versions[i] if i < len(versions) else 0
        if shndx == SHN_UNDEF:
            undefined.add(name)
            continue
        label = defs.get(version & 0x7FFF)
        label = None if label == name else label    # a version's own symbol: nm prints it bare
        spelled = f"{name}{'@' if version & VERSYM_HIDDEN else '@@'}{label}" if label else name
        defined.setdefault(name, []).append(spelled)
    return Symbols(defined, undefined, "elf")
