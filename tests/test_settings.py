"""Settings layer default < YAML < environment < flags; bad input gets a clear error."""

import subprocess
import sys
from pathlib import Path

import pytest

from echod.config import SETTINGS as ECHOD
from fleetd.config import SETTINGS as FLEETD
from ingero.errors import ConfigError
from ingero.settings import load
from ingerod.config import SETTINGS as INGEROD


def test_layering(tmp_path):
    config = tmp_path / "fleetd.yaml"
    config.write_text("quorum: 7\nk: 3\nexpected_nodes: {a: 4}\n")
    cfg = load(FLEETD, "FLEETD", config, {"k": "2.5"}, {"FLEETD_QUORUM": "9"})
    assert (cfg.quorum, cfg.k, cfg.expected_nodes) == (9, 2.5, {"a": 4})
    assert cfg.ema_alpha == 0.2


@pytest.mark.parametrize("text, message", [
    ("quorum: [1\n", "not valid YAML"),
    ("- a\n- b\n", "must hold a mapping"),
    ("qourum: 5\n", "unknown setting(s): qourum"),
    ("quorum: 0\n", "quorum"),
    ("k: lots\n", "k"),
    ("bind: localhost:7470\n", "ZeroMQ endpoint"),
    ("metrics_addr: nowhere\n", "HOST:PORT"),
])
def test_bad_config_files(tmp_path, text, message):
    config = tmp_path / "fleetd.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load(FLEETD, "FLEETD", config, {}, {})


def test_bad_flag_and_environment():
    with pytest.raises(ConfigError, match="--push-interval"):
        load(INGEROD, "INGEROD", None, {"push_interval": "-1"}, {})
    with pytest.raises(ConfigError, match="INGEROD_SOURCE"):
        load(INGEROD, "INGEROD", None, {}, {"INGEROD_SOURCE": "gpu"})


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=30)


def test_daemons_turn_config_errors_into_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("quorum: -3\n")
    result = run("fleetd", "--config", str(bad))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("Error: quorum")
    missing = run("ingerod", "--config", str(tmp_path / "none.yaml"))
    assert missing.returncode == 1 and "cannot read config file" in missing.stderr
    keys = run("ingerod", "--config", "/dev/null", "--fleet", "tcp://a:1,tcp://b:1,tcp://c:1",
               "--fleet-public-key", "/k/0.key,/k/1.key")
    assert keys.returncode == 1, keys.stderr
    assert keys.stderr.strip().splitlines()[-1] == (
        "Error: fleet_public_key names 2 files for 3 fleet endpoints: give one for all of them, "
        "or one per endpoint in the same order")
    bad.write_text("retention_days: 0\n")
    result = run("echod", "--config", str(bad))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("Error: retention_days")
    missing = run("echod", "--config", str(tmp_path / "none.yaml"))
    assert missing.returncode == 1 and "cannot read config file" in missing.stderr


MAN = Path(__file__).resolve().parent.parent / "man"


@pytest.mark.parametrize("page, table", [("fleetd.8", FLEETD), ("ingerod.8", INGEROD),
                                         ("echod.8", ECHOD)])
def test_every_setting_is_in_its_man_page(page, table):
    text = (MAN / page).read_text().replace("\\-", "-")
    undocumented = [s.flag for s in table if s.flag not in text]
    assert not undocumented, f"{page} does not document {undocumented}"
    config = (MAN / "ingero.yaml.5").read_text().replace("\\_", "_")
    assert not [s.name for s in table if s.name not in config]


def test_slurm_job_is_a_default_that_the_file_and_flags_override(tmp_path):
    from ingerod.cli import slurm_defaults

    found = slurm_defaults({"SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "4"})
    assert load(INGEROD, "INGEROD", None, {}, {}, found).job == "77"
    config = tmp_path / "ingerod.yaml"
    config.write_text("job: '12'\n")
    assert load(INGEROD, "INGEROD", config, {}, {}, found).job == "12"
    assert load(INGEROD, "INGEROD", config, {"job": "9"}, {}, found).job == "9"
    assert load(INGEROD, "INGEROD", None, {}, {"INGEROD_JOB_NODES": "2"}, found).job_nodes == 2


def test_taken_ports_are_one_line_errors(endpoint):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = run("fleetd", "--insecure-plaintext-zmq", "--bind", endpoint,
                      "--metrics-addr", f"127.0.0.1:{port}")
        assert metrics.returncode == 1 and "Traceback" not in metrics.stderr
        assert f"cannot serve metrics on 127.0.0.1:{port}" in metrics.stderr
        bind = run("fleetd", "--insecure-plaintext-zmq", "--bind", f"tcp://127.0.0.1:{port}",
                   "--metrics-addr", "none")
        assert bind.returncode == 1 and "Traceback" not in bind.stderr
        assert f"cannot bind tcp://127.0.0.1:{port}" in bind.stderr
