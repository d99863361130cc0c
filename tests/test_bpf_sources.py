"""The user-space mirrors of the BPF program's types stay in step with the C source."""

import ctypes
import re
from pathlib import Path

from ingerod.events import KINDS, OPS, RawEvent
from ingerod.probes import PARTS, PROBES, program_text

BPF = Path(__file__).resolve().parent.parent / "ingerod" / "bpf"
C_TYPES = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "s32": ctypes.c_int32}


def c_block(pattern: str) -> str:
    text = (BPF / "common.bpf.c").read_text()
    return re.search(pattern + r"\s*\{(.*?)\};", text, re.S).group(1)


def test_event_struct_matches_raw_event():
    fields = re.findall(r"^\s*(u64|u32|s32)\s+(\w+);", c_block(r"struct event"), re.M)
    assert [(name, C_TYPES[kind]) for kind, name in fields] == list(RawEvent._fields_)
    assert ctypes.sizeof(RawEvent) == sum(ctypes.sizeof(C_TYPES[k]) for k, _ in fields)


def c_enum(name: str) -> dict[int, str]:
    values, next_value = {}, 0
    for item in c_block(rf"enum {name}").split(","):
        item = item.strip()
        if not item:
            continue
        label, _, value = item.partition("=")
        next_value = int(value) if value.strip() else next_value
        values[next_value] = label.strip()
        next_value += 1
    return values


def test_ops_and_kinds_match_the_enums():
    assert sorted(c_enum("probe_op")) == sorted(OPS)
    assert sorted(c_enum("event_kind")) == sorted(KINDS)


def test_every_probe_names_a_function_of_the_program():
    text = program_text()
    defined = set(re.findall(r"^int (\w+)\(struct pt_regs \*ctx\)", text, re.M))
    for probe in PROBES:
        for fn in (probe.entry, probe.ret):
            assert fn is None or fn in defined, f"{probe.symbol}: no BPF function {fn}"
    assert all((BPF / part).exists() for part in PARTS)
