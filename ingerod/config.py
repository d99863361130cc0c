"""Every ingerod setting, declared once: flags, ingerod.yaml, INGEROD_* variables and ingerod(8)."""

import socket

from ingero import settings
from ingero.settings import (Setting, boolean, choice, env_matches, integer, name, number, optional,
                             optional_text, path, path_list, pid_list, text, zmq_endpoints)

DEFAULT_CONFIG = "/etc/ingero/ingerod.yaml"

SETTINGS = [
    Setting("fleet", "tcp://127.0.0.1:7470", zmq_endpoints,
            "fleetd's ZeroMQ endpoint; ingerod connects out and never listens. Several, "
            "comma-separated, when fleetd is sharded: the shards in order (0, 1, ...), the "
            "same list on every node; each job's events go to the shard that owns the job.",
            "ENDPOINT[,...]"),
    Setting("node", socket.gethostname(), name, "This node's name [default: the host name].",
            "NAME"),
    Setting("cluster", "default", name, "Cluster name; the cohort when no job is named.",
            "NAME"),
    Setting("job", None, optional_text,
            "Slurm job id this agent reports for; its cohort on fleetd [default: $SLURM_JOB_ID].",
            "JOBID"),
    Setting("job_nodes", None, optional(integer(1, 1_000_000)),
            "Nodes in the job, for fleetd's coverage [default: $SLURM_JOB_NUM_NODES].", "N"),
    Setting("source", "ebpf", choice("ebpf", "synthetic"),
            "Where the health signals come from: ebpf (trace the job) or synthetic (--score, "
            "--score-file, --script; for tests and demos).", "SOURCE"),
    Setting("score", 0.9, number(0.0, 1.0),
            "synthetic: the fixed score reported (all four signals at this value).", "SCORE"),
    Setting("score_file", None, optional(path),
            "synthetic: re-read the score from this file at every sample.", "FILE"),
    Setting("script", None, optional_text,
            "synthetic: scores over time, SECONDS:SCORE[,SECONDS:SCORE...]; 'idle' as a score "
            "reports no job.", "SCRIPT"),
    Setting("match_env", {}, env_matches,
            "ebpf: trace only processes whose environment has all of KEY=VALUE[,...] "
            "(a job step, one simulated node).", "KEY=VALUE"),
    Setting("pids", [], pid_list,
            "ebpf: trace only these processes, PID[,PID...] (with --job and --match-env, "
            "those too must match) [default: every process that maps CUDA or NCCL].", "PIDS"),
    Setting("libraries", [], path_list,
            "ebpf: CUDA/NCCL library files to attach at start, comma-separated, so processes "
            "that map them are traced from their first call (others attach when found).",
            "PATHS"),
    Setting("trusted_library_dirs", [], path_list,
            "ebpf: directories whose CUDA/NCCL libraries are attached whoever owns the files "
            "(a site's shared software tree). Elsewhere a library file owned by a user, not "
            "root, counts against that user's libraries_per_user.", "DIRS"),
    Setting("libraries_per_user", 16, integer(0, 10_000),
            "ebpf: library files owned by one user (a virtual environment's NCCL, cudart and "
            "libtorch_cuda) attached at most; past it a user's further files are refused, "
            "counted and logged: every file costs the agent open descriptors and a parse of "
            "the file as root.", "N"),
    Setting("library_grace", 600.0, number(1.0, 86_400.0),
            "ebpf: seconds a library file no traced process maps stays attached (the next job "
            "from the same environment is traced from its first call); then it is detached, "
            "and no longer counts against its owner's libraries_per_user.", "SECONDS"),
    Setting("launch_duty_cycle", 1.0, number(0.0, 1.0),
            "ebpf: fraction of each launch_duty_period during which kernel launches are "
            "counted (each launch costs a uprobe trap; 1 = always).", "FRACTION"),
    Setting("launch_duty_period", 10.0, number(0.1, 3600.0),
            "ebpf: seconds of one duty cycle of the launch counters.", "SECONDS"),
    Setting("rescan_interval", 2.0, number(0.1, 600.0),
            "ebpf: seconds between scans of /proc for new processes and libraries.",
            "SECONDS"),
    Setting("gpu_memory_bytes", None, optional(integer(2**20, 2**50)),
            "ebpf: device memory per GPU, against which allocations count as headroom used "
            "where NVML does not say what the GPUs use [default: the smallest GPU's, from "
            "NVML; 80 GiB where NVML does not answer].",
            "BYTES"),
    Setting("nvml_library", "libnvidia-ml.so.1", text,
            "ebpf: NVIDIA's management library, asked at each sample what each GPU uses of "
            "the memory it holds (the memory signal).", "PATH"),
    Setting("jobs_dir", "/var/lib/ingero/jobs", optional(path),
            "The job spool: the Slurm prolog and epilog leave a record of each job start and "
            "end here, which the agent forwards and then deletes (none: read no records).",
            "DIR"),
    Setting("control_socket", "/run/ingero/ingerod.sock", optional(path),
            "Unix socket on which a node-wide agent (no --job) tells the Slurm hooks it "
            "watches their job (none: do not listen; the prolog then starts a per-job agent).",
            "PATH"),
    Setting("push_interval", 5.0, number(0.05, 600.0),
            "Seconds between pushes (and health samples).", "SECONDS"),
    Setting("heartbeat_interval", 1.0, number(0.01, 60.0),
            "Seconds of silence before a heartbeat is sent.", "SECONDS"),
    Setting("liveness", 3, integer(1, 100),
            "Heartbeat intervals without word from fleetd before it counts as unreachable "
            "and the socket is replaced.", "N"),
    Setting("reconnect_max", 30.0, number(0.05, 3600.0),
            "Cap of the reconnect backoff, in seconds.", "SECONDS"),
    Setting("queue_dir", "/var/lib/ingero/ingerod", optional(path),
            "Where pushes fleetd has not acknowledged are kept (in NODE/node/, or NODE/job-JOB/ "
            "for a per-job agent), so that a restarted agent sends them again (none: in memory only, "
            "lost when the agent stops or dies).", "DIR"),
    Setting("max_unacked", 64, integer(1, 100_000),
            "Unacknowledged batches kept for resending; beyond it the oldest is dropped and "
            "counted.", "N"),
    Setting("warmup", 6, integer(0, 10_000),
            "Samples spent calibrating before the score counts.", "N"),
    Setting("hysteresis", 0.02, number(0.0, 0.5),
            "Margin around the bar before the straggler state flips.", "MARGIN"),
    Setting("fleet_fresh", 20.0, number(0.1, 3600.0),
            "A threshold younger than this (from a reachable fleetd) is used in fleet mode.",
            "SECONDS"),
    Setting("fleet_cached", 300.0, number(0.1, 86400.0),
            "A threshold younger than this is still used, in fleet-cached mode.", "SECONDS"),
    Setting("local_threshold", 0.85, number(0.0, 1.0),
            "The bar in local-baseline mode, when no fleet threshold is usable.", "SCORE"),
    settings.secret_key("ingerod", "This agent's"),
    Setting("fleet_public_key", "/etc/ingero/keys/fleetd.key", path_list,
            "fleetd's public key file. With several fleet endpoints (shards), one file for "
            "all of them (the shards share a key pair), or one per endpoint, comma-separated "
            "in the same order (each shard its own pair).", "FILE[,...]"),
    settings.insecure_plaintext_zmq(
        "Talk to fleetd without CURVE: no encryption, and fleetd cannot tell who pushes."),
    Setting("wire_maps", False, boolean,
            "Send every event as a map, as agents before wire 1.3 do, even to a fleetd that "
            "takes columns: about four times the bytes and tens of times fleetd's CPU per "
            "event. For a tool on the way that reads maps only.", is_flag=True),
    settings.metrics_addr(9471),
    Setting("metrics_textfile", None, optional(path),
            "Write the metrics to this file too, every push, for node_exporter's textfile "
            "collector (atomically; removed at exit), each series labelled job_id with --job: "
            "how per-job agents, which serve no port, are scraped [default: none].", "FILE"),
    Setting("drain_timeout", 2.0, number(0.0, 60.0),
            "On SIGTERM, seconds to wait for fleetd to acknowledge what is queued.", "SECONDS"),
    settings.log_level_setting(),
]
