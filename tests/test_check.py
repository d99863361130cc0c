"""``ingerod check``'s reading of a node, on trees made here: what is there, what is not, and
the agent's one word for why it cannot trace. The command itself runs in test_tracing."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingerod import check


def node(root: Path, *present: str) -> Path:
    for path in present:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        if path.endswith("/"):
            (root / path).mkdir(exist_ok=True)
        else:
            (root / path).write_text("")
    return root


def test_the_running_kernels_headers_are_found_where_bcc_looks(tmp_path):
    found = check.kernel_headers(node(tmp_path, "lib/modules/6.1.0-9-amd64/build/include/"),
                                 "6.1.0-9-amd64", environ={})
    assert found.ok and "6.1.0-9-amd64/build" in found.found
    other = check.kernel_headers(tmp_path, "6.18.44-custom", environ={})
    assert not other.ok and "apt-get install linux-headers-6.18.44-custom" in other.fix
    assert check.kernel_headers(node(tmp_path, "sys/kernel/kheaders.tar.xz"), "6.18.44-custom",
                                environ={}).ok                # the kernel's own
    empty = tmp_path / "empty"
    empty.mkdir()
    named = check.kernel_headers(tmp_path, "6.1.0-9-amd64",
                                 environ={"BCC_KERNEL_SOURCE": str(empty)})
    assert not named.ok and f"BCC_KERNEL_SOURCE={empty}" in named.found


def test_a_path_that_cannot_be_looked_at_reads_as_missing_not_as_a_crash(tmp_path, monkeypatch):
    """tracefs is mode 0700: run unprivileged, Python 3.11's Path.exists raises EACCES there,
    and the check (and an unprivileged agent finding out why it cannot trace) crashed."""
    def refused(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))
    monkeypatch.setattr(Path, "exists", refused)
    monkeypatch.setattr(Path, "is_dir", refused)
    found = check.checks(node(tmp_path, "sys/kernel/tracing/uprobe_events"), environ={})
    assert not next(c for c in found if c.name == "tracefs").ok
    assert check.reason(found) in set(check.REASONS.values())


@pytest.mark.parametrize("missing, said", [("bcc", "no_bcc"), ("privileges", "not_permitted"),
                                           ("kernel headers", "no_kernel_headers"),
                                           ("uprobes", "no_uprobes"), ("tracefs", "no_tracefs"),
                                           ("lockdown", "lockdown"), (None, "load_failed")])
def test_the_reason_is_the_first_need_missing(missing, said):
    names = ["bcc", "privileges", "kernel headers", "uprobes", "tracefs", "BTF", "lockdown"]
    found = [check.Check(name, name != missing, "", needed=name != "BTF") for name in names]
    found.append(check.Check("BTF", False, "none", needed=False))       # a note, never a reason
    assert check.reason(found) == said
