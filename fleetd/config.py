"""Every fleetd setting, declared once: flags, fleetd.yaml, FLEETD_* variables and fleetd(8)."""

from ingero import settings, wire
from ingero.settings import (Setting, boolean, integer, node_counts, number, optional, path, shard,
                             text, text_list, url_list, zmq_endpoint)

DEFAULT_CONFIG = "/etc/ingero/fleetd.yaml"


def causes(value) -> list[str]:
    """Verdict causes, ``A[,B...]``; each one fleetd names."""
    from ingero.analysis.causes import CAUSES

    named = text_list(value)
    unknown = sorted(set(named) - set(CAUSES))
    if unknown:
        raise ValueError(f"unknown cause(s) {', '.join(unknown)}; fleetd names "
                         f"{', '.join(CAUSES)}")
    return named

SETTINGS = [
    Setting("bind", "tcp://0.0.0.0:7470", zmq_endpoint,
            "ZeroMQ endpoint the ROUTER socket binds; agents connect here.", "ENDPOINT"),
    Setting("shard", "0/1", shard,
            "This fleetd is shard K of N: it owns the jobs whose cluster/job hashes to K (the "
            "agents' --fleet lists the N endpoints in shard order, and sends each job's events "
            "to its owner). Events of a job another shard owns are still taken, and counted and "
            "logged: the agents' lists disagree.", "K/N"),
    settings.secret_key("fleetd", "fleetd's"),
    settings.authorized_keys("/etc/ingero/authorized_agents", "agents'", "connect"),
    settings.insecure_plaintext_zmq(
        "Accept agents without CURVE: no encryption and no authentication of who pushes."),
    Setting("insecure_any_node_key", False, boolean,
            "Let any authorised agent key push as any node and cluster: a key stolen from one "
            "node then speaks for all of them. By default a key authorised as NODE.key pushes "
            "as node NODE only, one authorised as NODE@CLUSTER.key as NODE of CLUSTER only.",
            is_flag=True),
    settings.metrics_addr(9470),
    Setting("k", 2.0, number(0.1, 10.0),
            "Threshold width in robust standard deviations: median - k*1.4826*MAD.", "K"),
    Setting("ema_alpha", 0.2, number(0.01, 1.0),
            "Smoothing of the threshold between recomputes (1 = no smoothing).", "ALPHA"),
    Setting("mad_floor", 0.01, number(0.0, 0.5),
            "Smallest MAD used, so identical scores do not flag a node for noise.", "MAD"),
    Setting("quorum", 5, integer(1, 100_000),
            "Active nodes a cohort needs before it flags anyone.", "N"),
    Setting("ttl_multiplier", 5.0, number(1.0, 100.0),
            "A node expires after this many of its push intervals without a push.", "X"),
    Setting("panic_fraction", 0.5, number(0.0, 1.0),
            "Above this fraction of a cohort under the bar, raise one cohort alert "
            "(panic) instead of per-node verdicts.", "FRACTION"),
    Setting("coverage_alert", 0.8, number(0.0, 1.0),
            "Coverage (active over expected nodes) below which ingero_fleet_coverage_low is 1.",
            "FRACTION"),
    Setting("expected_nodes", {}, node_counts,
            "Expected node count per cluster, CLUSTER=N[,CLUSTER=N]; jobs declare their own.",
            "CLUSTER=N"),
    Setting("recompute_interval", 1.0, number(0.01, 60.0),
            "Seconds between threshold recomputes.", "SECONDS"),
    Setting("max_nodes", 10_000, integer(1, 1_000_000),
            "Most nodes tracked at once; pushes from further nodes are refused and counted.", "N"),
    Setting("max_ranks", 65_536, integer(2, 1 << 20),
            "Most ranks a job or communicator may have: an event naming a larger "
            "communicator, or a rank past it, is refused and counted (each rank of a "
            "communicator costs memory in its window, and a process may claim any size).", "N"),
    Setting("max_jobs_per_node", 256, integer(1, 1_000_000),
            "Most jobs one node's events may name at once (until --job-ttl after their last "
            "event): events of a further job are refused and counted (a process may claim any "
            "job id, and each job costs memory).", "N"),
    settings.max_frame_bytes(wire.MAX_FRAME_BYTES, 64 * 1024 * 1024, "message"),
    Setting("echod", None, optional(zmq_endpoint),
            "echod's ingest endpoint; everything fleetd accepts is forwarded there and kept "
            "until echod acknowledges it [default: none, nothing is stored].", "ENDPOINT"),
    Setting("echod_public_key", "/etc/ingero/keys/echod.key", path,
            "echod's public key file (fleetd's own key pair authenticates it to echod).", "FILE"),
    Setting("forward_batch_rows", 2000, integer(1, wire.MAX_FORWARD_ROWS - wire.MAX_EVENTS - 1),
            "Rows gathered before a batch is sealed and sent to echod.", "N"),
    Setting("forward_batch_bytes", 2 * 1024 * 1024, integer(64 * 1024, 64 * 1024 * 1024),
            "Bytes a batch to echod may hold, encoded: a larger one is split (a push of "
            "columns larger alone goes as its rows), so that echod takes every batch; keep it "
            "below echod's max_frame_bytes (4 MiB by default).", "BYTES"),
    Setting("forward_interval", 0.2, number(0.01, 60.0),
            "Seconds after its first row that a batch is sealed, however small.", "SECONDS"),
    Setting("forward_window", 8, integer(1, 1000),
            "Batches in flight to echod before waiting for acknowledgements.", "N"),
    Setting("forward_resend_after", 5.0, number(0.1, 600.0),
            "Seconds without an acknowledgement before a batch is sent to echod again.",
            "SECONDS"),
    Setting("spool_dir", "/var/lib/ingero/fleetd/spool", optional(path),
            "Where batches for echod are kept, on disk, until echod has them; fleetd answers "
            "an agent only once its rows are written there. 'none' keeps them in memory only: "
            "what echod has not acknowledged is lost when fleetd stops or dies.", "DIR"),
    Setting("spool_max_bytes", 1024 ** 3, integer(1024 * 1024, 1024 ** 4),
            "Most bytes the spool keeps; beyond it (or when its filesystem is full) raw events "
            "are dropped first, then health rows, verdicts last, each drop counted.", "BYTES"),
    Setting("hang_timeout", 30.0, number(0.5, 3600.0),
            "Seconds a collective may wait for a rank its peers entered before that rank is "
            "named hung (or dead, when its process exited).", "SECONDS"),
    Setting("lag_k", 3.0, number(0.5, 20.0),
            "Rank lag bar in robust standard deviations: median + k*1.4826*MAD of the ranks' "
            "median lags.", "K"),
    Setting("min_lag", 0.002, number(0.0, 60.0),
            "Seconds of lag below which no rank is named, however far it stands out "
            "(also at least 5% of a step).", "SECONDS"),
    Setting("clear_ticks", 3, integer(1, 1000),
            "Judgements of its communicator in a row without the finding before a rank "
            "verdict clears (a recompute with nothing new to judge counts neither way).", "N"),
    Setting("job_ttl", 300.0, number(1.0, 86_400.0),
            "Seconds without an event of a job before its analysis state is dropped.", "SECONDS"),
    Setting("gpu_model", None, optional(text),
            "GPU model of the cluster, to price idle GPU time from the rate table "
            "(e.g. H100-80GB).", "MODEL"),
    Setting("gpu_provider", None, optional(text),
            "Provider whose rate applies (e.g. ec2, gcp, lambda, coreweave).", "PROVIDER"),
    Setting("usd_per_gpu_hour", None, optional(number(0.0001, 10_000.0)),
            "Price of one GPU-hour in USD; overrides gpu-model and gpu-provider.", "USD"),
    Setting("rates_file", None, optional(path),
            "YAML table GPU model -> provider -> USD per GPU-hour, replacing the shipped one.",
            "FILE"),
    Setting("on_verdict", [], url_list,
            "POST a JSON notice to this URL when a rank verdict is raised, escalates or "
            "clears (ingero-monitoring(7) has its schema), signed with "
            "--on-verdict-secret-file; kept in the spool until the receiver takes it.",
            "URL", multiple=True),
    Setting("on_verdict_secret_file", None, optional(path),
            "File holding the secret the notices are signed with (HMAC-SHA256 in "
            "X-Ingero-Signature); required with --on-verdict unless "
            "--on-verdict-unsigned.", "FILE"),
    Setting("on_verdict_unsigned", False, boolean,
            "Send verdict notices unsigned: a receiver cannot tell fleetd's notices from "
            "forged ones.", is_flag=True),
    Setting("on_verdict_job_rate", 10, integer(1, 10_000),
            "Raised verdicts of one job told a minute; those beyond are counted, and the "
            "job's next notice says how many.", "N"),
    Setting("on_verdict_node_rate", 10, integer(1, 10_000),
            "Raised verdicts on one node told a minute, whatever their jobs (a user making up "
            "job ids pages no more); those beyond are counted as over the job rate.", "N"),
    Setting("on_verdict_cluster_rate", 60, integer(1, 100_000),
            "Raised verdicts in one cluster told a minute; those beyond are counted as over "
            "the job rate.", "N"),
    Setting("on_verdict_expiry", 600.0, number(10.0, 7 * 86_400.0),
            "Seconds a notice waits for its receiver (a webhook, or a Slurm action) before it "
            "is dropped unsent and counted: a receiver that keeps failing holds the notices "
            "after it up for that long at most.", "SECONDS"),
    Setting("on_verdict_max_pending", 10_000, integer(1, 10_000_000),
            "Notices a receiver may have waiting; past it the oldest is dropped and counted.",
            "N"),
    Setting("slurm_admin_comment", False, boolean,
            "Write a line per verdict into its Slurm job's AdminComment (scontrol update; "
            "fleetd's user must be a Slurm operator).", is_flag=True),
    Setting("slurm_notify", False, boolean,
            "Tell a verdict to its job's user with scontrol notify.", is_flag=True),
    Setting("drain_after", 0, integer(0, 1000),
            "Drain a node once its ranks are named with a --drain-causes cause in this many "
            "distinct jobs within --drain-window (scontrol update State=DRAIN, Reason "
            "naming the cause and jobs); 0 never drains.", "N"),
    Setting("drain_window", 7 * 86_400.0, number(60.0, 365 * 86_400.0),
            "Seconds within which the jobs that name a node count together.", "SECONDS"),
    Setting("drain_max_fraction", 0.1, number(0.0, 1.0),
            "Most of each of a node's partitions that ingero may have drained (its own "
            "drains, this one included); beyond, the node is not drained and it is logged.",
            "FRACTION"),
    Setting("drain_causes", "slow_gpu,hang,died", causes,
            "Causes that count against a node (hardware-side: the node, not the job).",
            "CAUSE[,CAUSE...]"),
    settings.log_level_setting(),
]
