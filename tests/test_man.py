"""The manual pages: they lint clean and say what the code does (flags, defaults, metrics, wire)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path

import click
import pytest

import echod.cli
import echod.tools  # noqa: F401 (declaring the tools fills REGISTRY)
import fleetd.cli
import ingero.command.cli
import ingerod.cli
from echod.api.metrics import ApiMetrics
from echod.config import SETTINGS as ECHOD
from echod.metrics import EchoMetrics
from echod.registry import REGISTRY
from fleetd.config import SETTINGS as FLEETD
from fleetd.metrics import FleetMetrics
from ingero import fields as wirefields, wire
from ingero.settings import load
from ingerod.config import SETTINGS as INGEROD
from ingerod.metrics import AgentMetrics

MAN = Path(__file__).resolve().parent.parent / "man"
PAGES = sorted(p for p in MAN.glob("*.[1-8]"))
PAGE_NAMES = ["echod.8", "fleetd.8", "ingerod.8", "ingero.1", "ingero.yaml.5",
              "ingero-wire.7", "ingero-slurm.8", "ingero-monitoring.7"]

# Every reason a rejected frame is counted under (ingero/wire.py, ingero/errors.py and
# fleetd/server.py).
REJECT_REASONS = ["frame_count", "too_large", "bad_header", "bad_version", "bad_type",
                  "bad_msgpack", "bad_schema", "bad_column", "unexpected_type",
                  "too_many_nodes", "internal_error"]
# The reasons echod (echod/ingest.py) counts: the wire's own, and unexpected_type.
ECHOD_REJECT_REASONS = [r for r in REJECT_REASONS if r not in ("too_many_nodes", "internal_error")]


def plain(page: Path | str) -> str:
    """The page's source with roff's escaped hyphens and underscores made plain."""
    path = page if isinstance(page, Path) else MAN / page
    return path.read_text().replace("\\-", "-").replace("\\_", "_")


def sections(text: str) -> dict[str, str]:
    """{section name: its source}, split at the .SH lines."""
    parts = re.split(r"^\.SH[ \t]+(.*)$", text, flags=re.M)
    return {name.strip().strip('"'): body for name, body in zip(parts[1::2], parts[2::2])}


def subsections(text: str) -> dict[str, str]:
    parts = re.split(r"^\.SS[ \t]+(.*)$", text, flags=re.M)
    return {name.strip().strip('"'): body for name, body in zip(parts[1::2], parts[2::2])}


def tagged(text: str, head: str) -> str:
    """The .TP paragraph one of whose tag lines (the first, and any after .TQ) matches the
    regex ``head``; '' if none does."""
    for block in text.split("\n.TP\n")[1:]:
        lines = block.split("\n")
        tags = [lines[0]] + [after for before, after in zip(lines, lines[1:]) if before == ".TQ"]
        if any(re.match(head, tag) for tag in tags):
            return block.split("\n.SS ")[0]
    return ""


def gives_default(block: str, default) -> bool:
    """Whether a paragraph says "Default: VALUE" (or "default VALUE"), VALUE maybe in a font."""
    pattern = r"[Dd]efault:?\s*(\n\.[BI]R? )?" + re.escape(str(default)) + r"(?=[.,;]?(\s|$))"
    return re.search(pattern, block) is not None


def test_all_pages_are_there():
    assert sorted(p.name for p in PAGES) == sorted(PAGE_NAMES)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_mandoc_lint_is_clean(page):
    mandoc = shutil.which("mandoc") or "/usr/bin/mandoc"
    assert Path(mandoc).exists(), "mandoc is needed to lint the manual pages"
    result = subprocess.run([mandoc, "-T", "lint", "-W", "warning", str(page)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and not result.stdout and not result.stderr, \
        result.stdout + result.stderr


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_required_sections(page):
    names = list(sections(page.read_text()))
    assert names[:3] == ["NAME", "SYNOPSIS", "DESCRIPTION"], names


@pytest.mark.parametrize("page", ["echod.8", "fleetd.8", "ingerod.8", "ingero.1"])
def test_section_order(page):
    order = ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "FILES", "ENVIRONMENT",
             "EXIT STATUS", "SIGNALS", "METRICS", "EXAMPLES", "OVERHEAD", "SEE ALSO"]
    names = list(sections((MAN / page).read_text()))
    assert set(names) <= set(order), set(names) - set(order)
    assert names == sorted(names, key=order.index)


def metric_names(metrics) -> set[str]:
    """The names a registry exports; counters are exposed with their _total suffix."""
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name + SUFFIX.get(family.type, ""))
    return names


SUFFIX = {"counter": "_total", "info": "_info"}   # what the exposition adds to the name

# echod's API serves its own metrics (at the API's /metrics, summed over the gunicorn workers);
# echod.8 lists them in this subsection of METRICS, apart from ingest's.
API_METRICS = "The API's metrics"


def metrics_section(page: str, metrics) -> str:
    """The part of a page's METRICS section that documents ``metrics``."""
    text = sections(plain(page))["METRICS"]
    if metrics is ApiMetrics:
        return subsections(text)[API_METRICS]
    return re.split(r"^\.SS[ \t]", text, maxsplit=1, flags=re.M)[0]


@pytest.mark.parametrize("page, metrics, prefix", [
    ("fleetd.8", FleetMetrics, "ingero_fleet_"), ("ingerod.8", AgentMetrics, "ingero_agent_"),
    ("echod.8", EchoMetrics, "ingero_echo_"), ("echod.8", ApiMetrics, "ingero_echo_")])
def test_every_metric_is_documented_and_no_other(page, metrics, prefix, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)   # a private registry
    exported = metric_names(metrics())
    assert exported and all(name.startswith(prefix) for name in exported)
    section = metrics_section(page, metrics)
    documented = set(re.findall(r"^\.BR? (" + prefix + r"\w+)", section, flags=re.M))
    assert exported - documented == set(), f"{page} METRICS lacks {exported - documented}"
    assert documented - exported == set(), f"{page} documents unknown {documented - exported}"


@pytest.mark.parametrize("page, metrics", [("fleetd.8", FleetMetrics),
                                           ("ingerod.8", AgentMetrics),
                                           ("echod.8", EchoMetrics), ("echod.8", ApiMetrics)])
def test_metric_labels_are_documented(page, metrics, monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    section = metrics_section(page, metrics)
    instance = metrics()
    for metric in vars(instance).values():
        labels = getattr(metric, "_labelnames", None)
        if labels is None:
            continue
        name = metric._name + SUFFIX.get(metric._type, "")
        if metric._type == "info":        # its labels are its values
            labels = tuple(sorted(metric._value))
        if labels:
            assert re.search(rf"^\.BR {name} {{ {','.join(labels)} }}$", section, re.M), name
        else:
            assert re.search(rf"^\.B {name}$", section, re.M), name


def test_every_tool_is_documented_with_its_arguments():
    """echod.8's Tools has one entry per tool of the registry, naming every argument, the
    required ones outside brackets."""
    text = subsections(sections(plain("echod.8"))["DESCRIPTION"])["Tools"]
    documented = set(re.findall(r"^\.TP\n\\fB(\w+)\\fP", text, flags=re.M))
    assert documented == {tool.name for tool in REGISTRY}
    for tool in REGISTRY:
        tag = tagged(text, rf"\\fB{tool.name}\\fP").split("\n", 1)[0]
        for argument in tool.input_schema["properties"]:
            assert f"\\fI{argument}\\fP" in tag, f"echod.8: {tool.name} lacks {argument}"
        for argument in tool.input_schema.get("required", []):
            assert f"[\\fI{argument}\\fP]" not in tag, f"echod.8: {tool.name} {argument}"


@pytest.mark.parametrize("page, table", [("fleetd.8", FLEETD), ("ingerod.8", INGEROD),
                                         ("echod.8", ECHOD)])
def test_every_setting_flag_is_documented_with_its_default(page, table):
    options = sections(plain(page))["OPTIONS"]
    for s in table:
        block = tagged(options, rf"\.BI? {s.flag}(\s|$)")
        assert block, f"{page}: no .TP entry for {s.flag}"
        if s.default not in (None, False, {}, []) and s.name != "node":
            assert gives_default(block, s.default), f"{page}: {s.flag} does not give {s.default}"


def click_options(command: click.Command):
    """Every option of a command and its subcommands, with its default."""
    for param in command.params:
        if isinstance(param, click.Option):
            yield command.name, param
    for sub in getattr(command, "commands", {}).values():
        yield from click_options(sub)


@pytest.mark.parametrize("page, command", [
    ("fleetd.8", fleetd.cli.main), ("ingerod.8", ingerod.cli.main),
    ("ingero.1", ingero.command.cli.main),
    ("echod.8", echod.cli.main)])
def test_every_command_line_option_is_documented(page, command):
    # A subcommand's options are in OPTIONS, or in COMMANDS where the page has one.
    text = sections(plain(page))
    options = text["OPTIONS"] + text.get("COMMANDS", "")
    for name, param in click_options(command):
        for flag in param.opts:
            block = tagged(options, rf"\.BI? {flag}(\s|$)")
            assert block, f"{page}: no .TP entry for {name} {flag}"
        if param.show_default and param.default not in (None, False):
            assert gives_default(block, param.default), \
                f"{page}: {flag} does not give {param.default}"


@pytest.mark.parametrize("section, table", [("FLEETD SETTINGS", FLEETD),
                                            ("INGEROD SETTINGS", INGEROD),
                                            ("ECHOD SETTINGS", ECHOD)])
def test_every_yaml_key_is_documented_with_its_default(section, table):
    text = sections(plain("ingero.yaml.5"))[section]
    for s in table:
        block = tagged(text, rf"\.B {s.name}$")
        assert block, f"ingero.yaml.5 {section}: no entry for {s.name}"
        if s.default not in (None, False, {}, []) and s.name != "node":
            assert gives_default(block, s.default), \
                f"ingero.yaml.5: {s.name} does not give {s.default}"


@pytest.mark.parametrize("name, table, prefix", [("fleetd", FLEETD, "FLEETD"),
                                                 ("ingerod", INGEROD, "INGEROD"),
                                                 ("echod", ECHOD, "ECHOD")])
def test_example_config_files_load(tmp_path, name, table, prefix):
    examples = sections(plain("ingero.yaml.5"))["EXAMPLES"]
    match = re.search(rf"^\.I /etc/ingero/{name}\.yaml\n.*?^\.EX\n(.*?)^\.EE", examples,
                      flags=re.M | re.S)
    assert match, f"no example {name}.yaml"
    config = tmp_path / f"{name}.yaml"
    config.write_text(match[1])
    cfg = load(table, prefix, config, {}, {})
    assert cfg.log_level == "info"


def test_every_message_type_is_documented_with_its_type_byte_and_fields():
    text = plain("ingero-wire.7")
    types = subsections(sections(text)["MESSAGE TYPES"])
    for byte, cls in wire.MESSAGE_TYPES.items():
        title = f"{cls.__name__} (type {byte})"
        assert title in types, f"ingero-wire.7 has no subsection {title!r}"
        inherited = set()
        for base in cls.__mro__[1:]:
            if base in wire.MESSAGE_TYPES.values():      # a message type extending another
                assert re.search(rf"^Every field of\n\.B {base.__name__}\n", types[title],
                                 re.M), f"ingero-wire.7: {title} does not say it extends {base}"
                inherited |= {f.name for f in fields(base)}
        for f in fields(cls):
            assert f.name in inherited or re.search(rf"^\.B {f.name}$", types[title], re.M), \
                f"ingero-wire.7: {title} does not document field {f.name}"


def test_wire_page_states_the_header_and_limits():
    text = plain("ingero-wire.7")
    assert wire.MAGIC.decode() in text and wire.HEADER_SIZE == 8
    for number in (wire.MAX_FRAME_BYTES, wire.MAX_EVENTS, wirefields.MAX_ATTRS, wirefields.MAX_TEXT,
                   wirefields.MAX_LIST):
        assert str(number) in text, number
    for state in wirefields.STATES + wire.SIGNALS:
        assert f".B {state}" in text or f".BR {state}" in text, state


def test_every_rejection_reason_is_documented():
    checks = sections(plain("ingero-wire.7"))["RECEIVER CHECKS"]
    for reason in REJECT_REASONS:
        assert re.search(rf"^\.B {reason}$", checks, re.M), reason
    fleetd_metrics = sections(plain("fleetd.8"))["METRICS"]
    for reason in REJECT_REASONS:
        assert reason in fleetd_metrics, reason
    echod_metrics = tagged(sections(plain("echod.8"))["METRICS"],
                           r"\.BR ingero_echo_frames_rejected_total ")
    for reason in ECHOD_REJECT_REASONS:
        assert re.search(rf"^\.BR? {reason}\b", echod_metrics, re.M), reason
    assert "too_many_nodes" not in echod_metrics


def test_every_setting_of_the_slurm_hooks_is_documented_with_its_default():
    """What slurmhook reads and what slurm/prolog reads itself (INGERO_PYTHON …)."""
    from ingero.slurmhook import SETTINGS

    text = sections(plain("ingero-slurm.8"))["ENVIRONMENT"]
    script = (MAN.parent / "slurm" / "prolog").read_text()
    names = set(SETTINGS) | set(re.findall(r"\b(INGERO_[A-Z_]+)\b", script))
    for name in sorted(names):
        block = tagged(text, rf"\.B {name}$")
        assert block, f"ingero-slurm.8: no entry for {name}"
        default = SETTINGS.get(name, ("",))[0]
        if default:
            assert gives_default(block, default), f"ingero-slurm.8 {name}: default {default}"
