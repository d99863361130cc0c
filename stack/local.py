"""The whole product on one machine: echod on its embedded PostgreSQL with its API over TLS and
a token, fleetd forwarding to it, and one node-wide ingerod per simulated node tracing the sim's
libraries with eBPF. ``ingero demo`` runs it; so do the end-to-end tests.

Every part is a real daemon started as a child process with its log under ``root``; ``stop()``
takes them all down (agents first, then fleetd, then echod and its PostgreSQL).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

from ingero.command.client import EchodClient
from ingero.errors import ApiCallError
from stack.launch import Daemon, KeyRing, free_port, stop_all, wait_for
from ingero.vocabulary import OWN_SEQUENCE

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
START_TIMEOUT_S = 180          # bcc compiles the probes of every agent on a 2-core machine
JUDGED_TIMEOUT_S = 90          # from a sim job's end until fleetd's word on all of it is stored
AGENT_STOP_S = 120             # drained, then its probes detached (0.1 s each on kernels < 6.6)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (openssl, as an operator would)."""
    cert, key = directory / "echod.crt", directory / "echod.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


class Echod:
    """echod with its HTTP API on an embedded PostgreSQL under ``root``, TLS with a
    self-signed certificate, and tokens made with 'echod token create'."""

    def __init__(self, root: Path, keys: KeyRing, *flags: str,
                 tokens: dict[str, tuple[str, str]], journal: bool = False,
                 env: dict | None = None):
        self.root, self.keys = root, keys
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o755)                       # the embedded PostgreSQL runs as postgres
        self.cert, self.key = self_signed(root)
        self.tokens_file = root / "tokens.yaml"
        self.audit_log = root / "audit.jsonl"
        self.tokens = {name: self.create_token(name, clusters, capabilities)
                       for name, (clusters, capabilities) in tokens.items()}
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ingest = f"tcp://127.0.0.1:{free_port()}"
        self.daemon = Daemon.module("echod", "echod", [
            "--ingest-bind", self.ingest, "--state-dir", str(root / "state"),
            "--metrics-addr", "none", "--api-bind", f"127.0.0.1:{self.port}",
            "--tls-cert", str(self.cert), "--tls-key", str(self.key),
            "--tokens-file", str(self.tokens_file), "--audit-log", str(self.audit_log),
            *keys.echod_flags(), *flags], root, journal=journal, env=env)
        if not wait_for(lambda: "ingest listening" in self.daemon.log()
                        or not self.daemon.alive(), START_TIMEOUT_S) or not self.daemon.alive():
            log = self.daemon.log()
            self.stop()
            raise RuntimeError(f"echod did not start:\n{log[-4000:]}")

    def echod(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "echod", "--tokens-file",
                               str(self.tokens_file), *args], capture_output=True, text=True,
                              timeout=60)

    def create_token(self, name: str, clusters: str, capabilities: str) -> str:
        done = self.echod("token", "create", name, "--clusters", clusters, "--capabilities",
                          capabilities)
        if done.returncode != 0:
            raise RuntimeError(f"echod token create {name}: {done.stderr.strip()}")
        return done.stdout.strip()

    def client(self, token: str) -> EchodClient:
        return EchodClient(self.url, self.tokens.get(token, token), str(self.cert))

    def stop(self, timeout: float = 60) -> int:
        """Stop echod, then its PostgreSQL should echod have left it, and remove ``root``."""
        from echod.embedded import EmbeddedPostgres

        status = self.daemon.stop(timeout)
        EmbeddedPostgres(self.root / "state" / "postgres").stop()
        shutil.rmtree(self.root, ignore_errors=True)
        return status


class Stack:
    """echod, fleetd and ``nodes`` node-wide ingerods (as the shipped unit runs them: no
    --job), the agents told apart by the sim's host label (INGERO_SIM_NODE, whatever the
    launcher), each with a job spool and control socket of its own under ``root``
    (``agent_flags`` come after, and may name others).
    ``skew`` puts a node's wall clock that many seconds ahead (faketime), as a real host's may
    be; ``agent_prefix`` runs a node's agent behind a command (``nsenter --net=…``), and
    fleetd listens on ``fleet_host``; ``node_flags`` are a node's agent's own flags (after the
    others, as ``node_env`` is its own environment on top); ``shards`` > 1 runs that many
    fleetds (``--shard K/N``, each forwarding to echod) and gives the agents all their
    endpoints; ``sim_hosts=False``
    lets each agent trace every process of the host, as with one real node (a real srun's
    ranks carry no sim host label); ``journal`` has every daemon log as under systemd
    (JOURNAL_STREAM set), each line led by its syslog priority; ``names`` are the agents' node
    names (node0, node1, ... by default), each with a key of its own that fleetd takes only
    that node's pushes from (``key_name``); ``fleet_env`` and
    ``echod_env`` are fleetd's and echod's own environment on top (SLURM_CONF for fleetd's
    Slurm actions and echod's questions to sacct, say). echod's directory (``echod_root``, by
    default under ``root``) must be reachable by the postgres user."""

    def __init__(self, root: Path, nodes: int, *, push_s: float = 1.0,
                 hang_timeout_s: float = 4.0, skew: dict[int, float] | None = None,
                 gpu: tuple[str, str] = ("H100-80GB", "lambda"), echod_flags: tuple = (),
                 agent_flags: tuple = (), fleet_flags: tuple = (),
                 echod_root: Path | None = None, fleet_host: str = "127.0.0.1",
                 agent_prefix: dict[int, tuple[str, ...]] | None = None, shards: int = 1,
                 node_flags: dict[int, tuple[str, ...]] | None = None,
                 sim_hosts: bool = True, journal: bool = False,
                 fleet_env: dict | None = None, echod_env: dict | None = None,
                 names: tuple[str, ...] | None = None,
                 node_env: dict[int, dict[str, str]] | None = None, say=lambda line: None):
        import sim

        self.root, self.push_s, self.agent_flags = root, push_s, agent_flags
        self.sim_hosts, self.journal = sim_hosts, journal
        self.agent_prefix = agent_prefix or {}
        self.node_flags = node_flags or {}
        self.node_env = node_env or {}
        # each shard its own pair, each node its own key
        self.names = names or tuple(f"node{n}" for n in range(nodes))
        self.keys = KeyRing.create(root / "keys", shards, tuple(map(self.key_name, self.names)))
        self.daemons: list[Daemon] = []
        self.unjudged = ""          # what the last wait_judged that timed out missed
        say("starting echod (its own PostgreSQL, HTTPS API with a token)")
        # no API drain on the way out: it keeps a load balancer off a stopping echod, and
        # nothing balances here (echod_flags may set one)
        self.echod = Echod(echod_root or root / "echod", self.keys, "--drain-seconds", "0",
                           *echod_flags,
                           tokens={"ops": ("*", "admin")}, journal=journal, env=echod_env)
        try:
            self.endpoints = [f"tcp://{fleet_host}:{free_port()}" for _ in range(shards)]
            self.fleet_ports = [free_port() for _ in range(shards)]
            self.fleetds = []
            for k, (endpoint, port) in enumerate(zip(self.endpoints, self.fleet_ports)):
                name = "fleetd" if shards == 1 else f"fleetd-shard{k}"
                say(f"starting {name} on {endpoint} (CURVE), forwarding to echod")
                self.fleetds.append(self._start(name, "fleetd", [
                    "--config", "/dev/null", "--bind", endpoint, "--shard", f"{k}/{shards}",
                    "--metrics-addr", f"127.0.0.1:{port}",
                    "--hang-timeout", str(hang_timeout_s), "--recompute-interval", "0.5",
                    "--gpu-model", gpu[0], "--gpu-provider", gpu[1],
                    *self.keys.fleetd_flags(k),
                    *self.keys.forwarding_flags(self.echod.ingest, root / f"{name}-spool"),
                    *fleet_flags], fleet_env))
            self.endpoint, self.fleet_port, self.fleetd = \
                self.endpoints[0], self.fleet_ports[0], self.fleetds[0]
            say(f"starting {nodes} ingerod agents with eBPF probes, one per simulated node "
                "(node-wide, no --job)")
            self.agent_ports = [free_port() for _ in range(nodes)]
            self.agents = [self._agent(n, (skew or {}).get(n), sim) for n in range(nodes)]
            ready = wait_for(lambda: all("pushing to" in a.log() for a in self.agents)
                             or not all(a.alive() for a in self.agents), START_TIMEOUT_S)
            if not ready or not all(a.alive() for a in self.agents):
                raise RuntimeError(f"the agents did not start:\n{self.logs()}")
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, module: str, args: list[str], env: dict | None = None,
               prefix: tuple[str, ...] = ()):
        daemon = Daemon.module(name, module, args, self.root, prefix, env=env,
                               journal=self.journal)
        self.daemons.append(daemon)
        return daemon

    def _agent(self, node: int, skew_s: float | None, sim) -> Daemon:
        libraries = sim.traced_libraries()
        env = {**({} if not skew_s else {"LD_PRELOAD": str(FAKETIME), "FAKETIME": f"+{skew_s}",
                                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"}),
               **self.node_env.get(node, {})} or None
        return self._start(f"ingerod-node{node}", "ingerod", [
            "--config", "/dev/null", "--source", "ebpf", "--libraries", libraries,
            "--fleet", ",".join(self.endpoints), "--node", self.names[node], "--cluster", "sim",
            *(("--match-env", f"INGERO_SIM_NODE={node}") if self.sim_hosts else ()),
            "--push-interval", str(self.push_s),
            "--rescan-interval", "0.2", "--metrics-addr", f"127.0.0.1:{self.agent_ports[node]}",
            "--jobs-dir", str(self.root / f"jobs-node{node}"),
            "--control-socket", str(self.root / f"ingerod-node{node}.sock"),
            "--queue-dir", str(self.root / "queue"),
            *self.keys.ingerod_flags(self.key_name(self.names[node])), *self.agent_flags,
            *self.node_flags.get(node, ())], env,
            self.agent_prefix.get(node, ()))

    @staticmethod
    def key_name(node: str) -> str:
        """The name a node's key is authorised under: that node of cluster sim only."""
        return f"{node}@sim"

    def restart_agent(self, node: int, down_s: float = 0.0) -> Daemon:
        """kill -9 ``node``'s agent and start it again, as systemd would; returns once it
        pushes again (it compiles its probes anew first)."""
        old = self.agents[node]
        before = old.log().count("pushing to")
        new = self.agents[node] = old.restarted(down_s)
        self.daemons[self.daemons.index(old)] = new
        if not wait_for(lambda: new.log().count("pushing to") > before or not new.alive(),
                        START_TIMEOUT_S) or not new.alive():
            raise RuntimeError(f"node{node}'s agent did not come back:\n{new.log()[-4000:]}")
        return new

    def wait_judged(self, job: str, result, timeout: float = JUDGED_TIMEOUT_S) -> bool:
        """Wait until what fleetd makes of a finished sim job is all in echod: for each
        communicator, the lag summary of the last instance every one of its ranks entered (as
        the sim's records of ``result``, its ClusterResult, say), and each verdict still live
        stored since (fleetd stores it again, with all it cost, once its communicator
        retires). fleetd forwards a tick's verdicts with the summaries of the instances it
        settled and judged then, after the events themselves; so by then echod holds every
        collective of the job and every verdict fleetd gave on them. A condition, not a
        clock: a busy machine makes it come later, not wrong. False if it has not come by
        ``timeout``."""
        last = last_instances([rank.record_path for rank in result.ranks])
        if not last:
            return True
        quoted = job.replace("'", "''")

        def judged() -> bool:
            rows = self.client().sql(
                f"SELECT comm_hash, max(seq_last), extract(epoch FROM max(t))::float8 "
                f"FROM peer_lag WHERE job = '{quoted}' GROUP BY comm_hash")["rows"]
            summarised = {comm: seq for comm, seq, _t in rows}
            behind = {comm: (summarised.get(comm, -1), seq) for comm, seq in last.items()
                      if summarised.get(comm, -1) < seq}
            self.unjudged = (f"job {job} not judged whole: communicators summarised short of "
                             f"their last instance (summarised, last): {behind}" if behind else
                             f"job {job}: a live verdict not stored since its last summary")
            if behind:
                return False
            latest = max(t for _comm, _seq, t in rows)
            return all(v["last_seen"] and datetime.fromisoformat(v["last_seen"]).timestamp()
                       >= latest for v in self.tool("find_stragglers", job=job)["verdicts"]
                       if v["cleared"] is None)

        if wait_for(judged, timeout, interval=0.25):
            self.unjudged = ""
            return True
        self.unjudged += "".join(f"\n{line}" for d in self.agents
                                 for line in d.log().splitlines() if "traced no longer" in line)
        self.unjudged += self._held(job, result)
        return False

    def _held(self, job: str, result) -> str:
        """What a wait_judged that timed out needs to be read: per communicator and rank, the
        last collective echod holds against the last its record says it entered, and what the
        agents lost and fleetd could not place."""
        from sim.records import read_record

        quoted = job.replace("'", "''")
        held = {(comm, rank): (seq, n) for comm, rank, seq, n in self.client().sql(
            f"SELECT comm_hash, rank, max(seq), count(*) FROM events WHERE job = '{quoted}' "
            f"AND kind = 'collective' GROUP BY comm_hash, rank")["rows"]}
        lines = []
        for r in result.ranks:
            last: dict[str, int] = {}
            for c in read_record(r.record_path).collectives:
                comm = f"{c['comm_id_hash']:016x}"
                last[comm] = max(last.get(comm, -1), c["seq"])
            lines += [f"rank {r.rank} (pid {r.pid}, {r.status}) on {comm}: echod holds up to "
                      f"{held.get((comm, r.rank), (None, 0))}, its record {seq}"
                      for comm, seq in sorted(last.items())
                      if held.get((comm, r.rank), (None,))[0] != seq]
        counters = [f"node{n}: {name} {value}" for n, port in enumerate(self.agent_ports)
                    for name, value in scraped(port, (
                        "ingero_agent_events_lost_total", "ingero_agent_events_dropped_total",
                        "ingero_agent_batches_dropped_total"))]
        counters += [f"fleetd: {name} {value}" for name, value in scraped(
            self.fleet_port, (
            "ingero_fleet_unaligned_collectives_total", "ingero_fleet_incomplete_collectives"))]
        return "".join(f"\n{line}" for line in ["per rank, (last seq, events) against the "
                                                 "record, where they differ:", *lines, *counters])

    @property
    def token(self) -> str:
        return self.echod.tokens["ops"]

    def client(self) -> EchodClient:
        return self.echod.client("ops")

    def tool(self, name: str, **args) -> dict:
        """A tool's answer; a server error comes with the end of echod's log, which says why."""
        try:
            return self.client().call(name, args)
        except ApiCallError as exc:
            if exc.status is None or exc.status < 500:
                raise
            raise ApiCallError(f"{exc}\n--- echod's log\n{self.echod.daemon.log()[-6000:]}",
                               exc.code, exc.status, exc.retry_after) from exc

    def logs(self) -> str:
        """The end of each daemon's log; first, what a wait_judged that timed out missed."""
        return "\n".join([*filter(None, [self.unjudged]), *(
            f"--- {d.name}\n{d.log()[-4000:]}" for d in self.daemons)])

    def stop(self) -> list[int]:
        """Agents, fleetd, then echod: the exit status of each, in that order. fleetd stops
        once every agent has drained what it had for it (said "stopping:"), echod once fleetd
        has forwarded what it held; the agents meanwhile detach their probes, which need
        neither (as uprobe_multi links, at once; as perf events, on kernels older than 6.6,
        the kernel takes about 0.1 s a uprobe, one after another)."""
        fleet = len(self.fleetds)
        agents = self.daemons[fleet:]
        said = [agent.log().count("stopping:") for agent in agents]   # a restart's log goes on
        for agent in agents:
            agent.terminate()
        wait_for(lambda: all(a.log().count("stopping:") > n or not a.alive()
                             for a, n in zip(agents, said)), 30)
        fleet_statuses = stop_all(self.daemons[:fleet], 30)
        echod_status = self.echod.stop()
        return [a.stop(AGENT_STOP_S) for a in agents] + fleet_statuses + [echod_status]


def scraped(port: int, names: tuple[str, ...]) -> list[tuple[str, float]]:
    """The named samples of a daemon's Prometheus endpoint on this machine (none if it does
    not answer)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return []
    return [(s.name, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name in names]


def last_instances(records: list[Path]) -> dict[str, int]:
    """Per communicator (its hash as fleetd and echod write it), the last collective instance
    every rank that recorded collectives on it entered, from the sim's records; sends and
    receives are left out (fleetd summarises no lag of theirs)."""
    from sim.records import read_record

    reached: dict[str, list[int]] = {}
    for path in records:
        last: dict[str, int] = {}
        for c in read_record(path).collectives:
            if c["op"] not in OWN_SEQUENCE:
                comm = f"{c['comm_id_hash']:016x}"
                last[comm] = max(last.get(comm, -1), c["seq"])
        for comm, seq in last.items():
            reached.setdefault(comm, []).append(seq)
    return {comm: min(seqs) for comm, seqs in reached.items() if len(seqs) >= 2}
