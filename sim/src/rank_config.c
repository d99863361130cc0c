/* The rank's settings: identity from the launcher's environment, the job from flags. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rank.h"

static const char usage_text[] =
    "usage: ingero-sim-rank [options]\n"
    "Runs one rank of a simulated training job through the sim's libcudart/libnccl.\n"
    "Rank and world size come from the launcher: RANK/WORLD_SIZE/LOCAL_RANK (torchrun),\n"
    "OMPI_COMM_WORLD_* or PMIX_RANK (mpirun), else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID;\n"
    "the job id from SLURM_JOB_ID, else TORCHELASTIC_RUN_ID.\n"
    "  --steps N               training steps (default 10)\n"
    "  --step-ms MS            GPU compute per step (default 20)\n"
    "  --kernels N             kernel launches per forward pass (default 4)\n"
    "  --bytes B               bytes per gradient all-reduce (default 4194304)\n"
    "  --dtype NAME            float32, float16, bfloat16, float64, int8, uint8, int32,\n"
    "                          uint32, int64, uint64 (default float32)\n"
    "  --extra LIST            comma list of allgather,reducescatter,broadcast,reduce,sendrecv,\n"
    "                          alltoall,alltoallv\n"
    "  --nccl-init MODE        config, scalable or nonblocking (default config)\n"
    "  --loop NAME             sim (the default) or pytorch: DDP's step (see the README)\n"
    "  --buckets N             loop pytorch: gradient all-reduces a step (default 1)\n"
    "  --gemm-share F          loop pytorch: share of launches by cuLaunchKernelEx (0.15)\n"
    "  --graphs-from N         from step N, capture the step's kernels and collectives in a\n"
    "                          CUDA graph once and replay it each step (cudaGraphLaunch)\n"
    "  --subgroup RANKS        comma list of world ranks all-reducing among themselves each\n"
    "                          step, split from the world (others pass NCCL_SPLIT_NOCOLOR);\n"
    "                          may repeat (8 at most)\n"
    "  --host-work-ms MS       CPU time of host work (data loading) per step (default 0.5)\n"
    "  --delay SPEC            host delay before the all-reduce, SPEC = ms=M[,from=F]\n"
    "                          [,every=E][,until=U][,before=allreduce|subgroup|\n"
    "                          alltoallv]; may repeat\n"
    "  --die-at N              exit 1 without cleanup at the start of step N\n"
    "  --hang-at N             stop calling anything at the start of step N\n"
    "  --restart-at N          exit 4 at the start of step N, for an elastic restart\n"
    "  --first-step N          start at step N (a run after an elastic restart)\n"
    "  --tp N                  tensor-parallel group size (split from the world; default 1)\n"
    "  --pp N                  pipeline stages (default 1)\n"
    "  --stage-work MS,MS,...  GPU compute per step of each stage (default --step-ms)\n"
    "  --memcpy-every N        blocking device-to-host copy every N steps (default 5; 0 off)\n"
    "  --loss-every N          read the loss after the forward pass every N steps: a sync on\n"
    "                          the rank's own kernels, as loss.item() (default 1; 0 off)\n"
    "  --jitter-ms MS          random host time per step, uniform in [0, MS] (default 0)\n"
    "  --sync-every N          the host waits for its GPU every N steps only (default 1)\n"
    "  --workers N             data-loader worker processes, forked each epoch (default 0)\n"
    "  --epoch-steps N         steps per epoch; workers exit and respawn (default: all)\n"
    "  --input PATH            the file the workers read batches from\n"
    "  --input-kb KB           read per batch (default 256)\n"
    "  --worker-cpu-ms MS      CPU time to decode a batch (default 1)\n"
    "  --input-stall-ms MS     extra time each read takes, a slow store (default 0)\n"
    "  --record PATH           ground-truth JSON lines (required)\n"
    "  --unique-id-file PATH   where rank 0 writes, and the others read, the ncclUniqueId\n"
    "example: RANK=0 WORLD_SIZE=1 ingero-sim-rank --steps 5 --record /tmp/r0.jsonl "
    "--unique-id-file /tmp/uid\n";

static const struct {
    const char *name;
    ncclDataType_t datatype;
} datatypes[] = {
    { "int8", ncclInt8 }, { "uint8", ncclUint8 }, { "int32", ncclInt32 },
    { "uint32", ncclUint32 }, { "int64", ncclInt64 }, { "uint64", ncclUint64 },
    { "float16", ncclFloat16 }, { "float32", ncclFloat32 }, { "float64", ncclFloat64 },
    { "bfloat16", ncclBfloat16 },
};

static const char *const datatype_enum_names[] = {
    "ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
    "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16",
};

const char *datatype_name(ncclDataType_t datatype)
{
    return (unsigned int)datatype < ncclNumTypes ? datatype_enum_names[datatype] : "unknown";
}

size_t datatype_size(ncclDataType_t datatype)
{
    switch (datatype) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 4;
    }
}

static int fail(const char *what, const char *value)
{
    fprintf(stderr, "ingero-sim-rank: bad %s '%s'\n%s", what, value, usage_text);
    return EXIT_USAGE;
}

static int parse_long(const char *text, long minimum, long *out)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno || end == text || *end || value < minimum)
        return -1;
    *out = value;
    return 0;
}

static int parse_double(const char *text, double minimum, double *out)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno || end == text || *end || value < minimum)
        return -1;
    *out = value;
    return 0;
}

/* The first of ``names`` that is set, as an integer; ``fallback`` when none is. */
static int env_first(const char *const names[], int fallback)
{
    long value;
    for (int i = 0; names[i]; i++) {
        const char *text = getenv(names[i]);
        if (text && *text && parse_long(text, 0, &value) == 0)
            return (int)value;
    }
    return fallback;
}

/* Identity as a training script reads it: the launcher that spawned the process (torchrun's
 * variables, Open MPI's, PMIx's) before Slurm's task id, which under torchrun or mpirun is
 * the per-node launcher's. The node is the sim's own host label. */
static void read_identity(struct rank_config *cfg)
{
    static const char *const rank[] = { "RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                         "PMI_RANK", "SLURM_PROCID", NULL };
    static const char *const world[] = { "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                          "SLURM_NTASKS", NULL };
    static const char *const local[] = { "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "MPI_LOCALRANKID", "SLURM_LOCALID", NULL };
    static const char *const local_world[] = { "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                                "SLURM_NTASKS_PER_NODE", NULL };
    static const char *const node[] = { "INGERO_SIM_NODE", "SLURM_NODEID", "GROUP_RANK", NULL };
    cfg->rank = env_first(rank, 0);
    cfg->world_size = env_first(world, 1);
    cfg->local_rank = env_first(local, 0);
    cfg->local_world_size = env_first(local_world, cfg->world_size);
    cfg->node = env_first(node, 0);
    const char *job = getenv("SLURM_JOB_ID");
    if (!job || !*job)
        job = getenv("TORCHELASTIC_RUN_ID");
    snprintf(cfg->job_id, sizeof cfg->job_id, "%s", job && *job ? job : "");
}

static int parse_datatype(const char *text, ncclDataType_t *out)
{
    for (size_t i = 0; i < sizeof datatypes / sizeof datatypes[0]; i++)
        if (strcmp(text, datatypes[i].name) == 0) {
            *out = datatypes[i].datatype;
            return 0;
        }
    return -1;
}

static int parse_extras(const char *text, unsigned int *out)
{
    static const struct { const char *name; unsigned int bit; } names[] = {
        { "allgather", EXTRA_ALL_GATHER }, { "reducescatter", EXTRA_REDUCE_SCATTER },
        { "broadcast", EXTRA_BROADCAST }, { "reduce", EXTRA_REDUCE },
        { "sendrecv", EXTRA_SEND_RECV }, { "alltoall", EXTRA_ALL_TO_ALL },
        { "alltoallv", EXTRA_ALL_TO_ALLV },
    };
    char copy[256], *save = NULL;
    snprintf(copy, sizeof copy, "%s", text);
    for (char *word = strtok_r(copy, ",", &save); word; word = strtok_r(NULL, ",", &save)) {
        size_t i = 0;
        while (i < sizeof names / sizeof names[0] && strcmp(word, names[i].name) != 0)
            i++;
        if (i == sizeof names / sizeof names[0])
            return -1;
        *out |= names[i].bit;
    }
    return 0;
}

static int parse_delay_field(struct delay_rule *rule, const char *name, const char *value)
{
    double ms;
    long n;
    if (strcmp(name, "ms") == 0 && parse_double(value, 0, &ms) == 0)
        rule->delay_ns = (int64_t)(ms * 1e6);
    else if (strcmp(name, "from") == 0 && parse_long(value, 0, &n) == 0)
        rule->from = (int)n;
    else if (strcmp(name, "every") == 0 && parse_long(value, 1, &n) == 0)
        rule->every = (int)n;
    else if (strcmp(name, "until") == 0 && parse_long(value, 0, &n) == 0)
        rule->until = (int)n;
    else if (strcmp(name, "before") == 0 && strcmp(value, "allreduce") == 0)
        rule->before = BEFORE_ALLREDUCE;
    else if (strcmp(name, "before") == 0 && strcmp(value, "subgroup") == 0)
        rule->before = BEFORE_SUBGROUP;
    else if (strcmp(name, "before") == 0 && strcmp(value, "alltoallv") == 0)
        rule->before = BEFORE_ALLTOALLV;
    else
        return -1;
    return 0;
}

/* "ms=40,from=5,every=1,until=9" */
static int parse_delay(const char *text, struct delay_rule *rule)
{
    *rule = (struct delay_rule){ .delay_ns = -1, .from = 0, .every = 1, .until = -1 };
    char copy[256], *save = NULL;
    snprintf(copy, sizeof copy, "%s", text);
    for (char *field = strtok_r(copy, ",", &save); field; field = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(field, '=');
        if (!eq)
            return -1;
        *eq = '\0';
        if (parse_delay_field(rule, field, eq + 1) < 0)
            return -1;
    }
    return rule->delay_ns < 0 ? -1 : 0;
}

int64_t rank_delay_ns(const struct rank_config *cfg, int step, enum delay_place before)
{
    int64_t total = 0;
    for (int i = 0; i < cfg->ndelays; i++) {
        const struct delay_rule *d = &cfg->delays[i];
        if (d->before != before)
            continue;
        int in_range = step >= d->from && (d->until < 0 || step <= d->until);
        if (in_range && (step - d->from) % d->every == 0)
            total += d->delay_ns;
    }
    return total;
}

enum option_id {
    OPT_STEPS = 1, OPT_STEP_MS, OPT_KERNELS, OPT_BYTES, OPT_DTYPE, OPT_EXTRA, OPT_HOST_WORK,
    OPT_DELAY, OPT_DIE_AT, OPT_HANG_AT, OPT_MEMCPY_EVERY, OPT_RECORD, OPT_UNIQUE_ID, OPT_HELP,
    OPT_LOSS_EVERY, OPT_JITTER, OPT_WORKERS, OPT_EPOCH, OPT_INPUT, OPT_INPUT_KB, OPT_WORKER_CPU,
    OPT_INPUT_STALL, OPT_RESTART_AT, OPT_FIRST_STEP, OPT_TP, OPT_PP, OPT_STAGE_WORK,
    OPT_SYNC_EVERY, OPT_NCCL_INIT, OPT_SUBGROUP, OPT_LOOP, OPT_BUCKETS, OPT_GEMM_SHARE,
    OPT_GRAPHS_FROM,
};

static const struct option options[] = {
    { "steps", required_argument, NULL, OPT_STEPS },
    { "step-ms", required_argument, NULL, OPT_STEP_MS },
    { "kernels", required_argument, NULL, OPT_KERNELS },
    { "bytes", required_argument, NULL, OPT_BYTES },
    { "dtype", required_argument, NULL, OPT_DTYPE },
    { "extra", required_argument, NULL, OPT_EXTRA },
    { "host-work-ms", required_argument, NULL, OPT_HOST_WORK },
    { "delay", required_argument, NULL, OPT_DELAY },
    { "die-at", required_argument, NULL, OPT_DIE_AT },
    { "hang-at", required_argument, NULL, OPT_HANG_AT },
    { "memcpy-every", required_argument, NULL, OPT_MEMCPY_EVERY },
    { "loss-every", required_argument, NULL, OPT_LOSS_EVERY },
    { "jitter-ms", required_argument, NULL, OPT_JITTER },
    { "workers", required_argument, NULL, OPT_WORKERS },
    { "epoch-steps", required_argument, NULL, OPT_EPOCH },
    { "input", required_argument, NULL, OPT_INPUT },
    { "input-kb", required_argument, NULL, OPT_INPUT_KB },
    { "worker-cpu-ms", required_argument, NULL, OPT_WORKER_CPU },
    { "input-stall-ms", required_argument, NULL, OPT_INPUT_STALL },
    { "restart-at", required_argument, NULL, OPT_RESTART_AT },
    { "first-step", required_argument, NULL, OPT_FIRST_STEP },
    { "sync-every", required_argument, NULL, OPT_SYNC_EVERY },
    { "nccl-init", required_argument, NULL, OPT_NCCL_INIT },
    { "subgroup", required_argument, NULL, OPT_SUBGROUP },
    { "loop", required_argument, NULL, OPT_LOOP },
    { "buckets", required_argument, NULL, OPT_BUCKETS },
    { "gemm-share", required_argument, NULL, OPT_GEMM_SHARE },
    { "graphs-from", required_argument, NULL, OPT_GRAPHS_FROM },
    { "tp", required_argument, NULL, OPT_TP },
    { "pp", required_argument, NULL, OPT_PP },
    { "stage-work", required_argument, NULL, OPT_STAGE_WORK },
    { "record", required_argument, NULL, OPT_RECORD },
    { "unique-id-file", required_argument, NULL, OPT_UNIQUE_ID },
    { "help", no_argument, NULL, OPT_HELP },
    { NULL, 0, NULL, 0 },
};

static int set_int(const char *option, const char *arg, long minimum, int *field)
{
    long n;
    if (parse_long(arg, minimum, &n))
        return fail(option, arg);
    *field = (int)n;
    return 0;
}

static int set_ms(const char *option, const char *arg, int64_t *field_ns)
{
    double ms;
    if (parse_double(arg, 0, &ms))
        return fail(option, arg);
    *field_ns = (int64_t)(ms * 1e6);
    return 0;
}

static int add_delay(struct rank_config *cfg, const char *arg)
{
    if (cfg->ndelays == MAX_DELAY_RULES || parse_delay(arg, &cfg->delays[cfg->ndelays]))
        return fail("--delay", arg);
    cfg->ndelays++;
    return 0;
}

static int set_bytes(struct rank_config *cfg, const char *arg)
{
    long n;
    if (parse_long(arg, 0, &n))
        return fail("--bytes", arg);
    cfg->allreduce_bytes = (size_t)n;
    return 0;
}

/* "40,20": each stage's GPU compute per step, in ms */
static int parse_stage_work(struct rank_config *cfg, const char *text)
{
    char copy[256], *save = NULL;
    int n = 0;
    snprintf(copy, sizeof copy, "%s", text);
    for (char *word = strtok_r(copy, ",", &save); word; word = strtok_r(NULL, ",", &save)) {
        double ms;
        if (n == MAX_STAGES || parse_double(word, 0, &ms))
            return -1;
        cfg->stage_work_ns[n++] = (int64_t)(ms * 1e6);
    }
    cfg->stage_works = n;
    return n ? 0 : -1;
}

static int set_kb(struct rank_config *cfg, const char *arg)
{
    long n;
    if (parse_long(arg, 1, &n))
        return fail("--input-kb", arg);
    cfg->input_bytes = (size_t)n * 1024;
    return 0;
}

static int set_nccl_init(struct rank_config *cfg, const char *arg)
{
    static const char *const modes[] = { "config", "scalable", "nonblocking" };
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(arg, modes[i]) == 0) {
            cfg->nccl_init = (enum nccl_init)i;
            return 0;
        }
    return fail("--nccl-init", arg);
}

static int set_loop(struct rank_config *cfg, const char *arg)
{
    if (strcmp(arg, "sim") == 0 || strcmp(arg, "pytorch") == 0) {
        cfg->loop = strcmp(arg, "pytorch") == 0 ? LOOP_PYTORCH : LOOP_SIM;
        return 0;
    }
    return fail("--loop", arg);
}

static int set_share(struct rank_config *cfg, const char *arg)
{
    double share;
    if (parse_double(arg, 0, &share) || share > 1)
        return fail("--gemm-share", arg);
    cfg->gemm_share = share;
    return 0;
}

/* "0,1,2,3": the world ranks of one more subgroup; the rank keeps only whether it is in it. */
static int add_subgroup(struct rank_config *cfg, const char *arg)
{
    char copy[4096], *save = NULL;
    int in = 0, n = 0;
    if (cfg->subgroups == MAX_SUBGROUPS)
        return fail("--subgroup", "more than 8");
    snprintf(copy, sizeof copy, "%s", arg);
    for (char *word = strtok_r(copy, ",", &save); word; word = strtok_r(NULL, ",", &save)) {
        long member;
        if (parse_long(word, 0, &member))
            return fail("--subgroup", arg);
        in |= member == cfg->rank;
        n++;
    }
    if (!n)
        return fail("--subgroup", arg);
    cfg->in_subgroup[cfg->subgroups++] = (unsigned char)in;
    return 0;
}

/* One option into cfg; 0 on success, else the exit status. */
static int apply_option(struct rank_config *cfg, int id, const char *arg)
{
    switch (id) {
    case OPT_STEPS: return set_int("--steps", arg, 1, &cfg->steps);
    case OPT_KERNELS: return set_int("--kernels", arg, 1, &cfg->kernels);
    case OPT_DIE_AT: return set_int("--die-at", arg, 0, &cfg->die_at);
    case OPT_HANG_AT: return set_int("--hang-at", arg, 0, &cfg->hang_at);
    case OPT_RESTART_AT: return set_int("--restart-at", arg, 0, &cfg->restart_at);
    case OPT_FIRST_STEP: return set_int("--first-step", arg, 0, &cfg->first_step);
    case OPT_SYNC_EVERY: return set_int("--sync-every", arg, 1, &cfg->sync_every);
    case OPT_TP: return set_int("--tp", arg, 1, &cfg->tp);
    case OPT_NCCL_INIT: return set_nccl_init(cfg, arg);
    case OPT_SUBGROUP: return add_subgroup(cfg, arg);
    case OPT_LOOP: return set_loop(cfg, arg);
    case OPT_BUCKETS: return set_int("--buckets", arg, 1, &cfg->buckets);
    case OPT_GEMM_SHARE: return set_share(cfg, arg);
    case OPT_GRAPHS_FROM: return set_int("--graphs-from", arg, 0, &cfg->graphs_from);
    case OPT_PP: return set_int("--pp", arg, 1, &cfg->pp);
    case OPT_STAGE_WORK: return parse_stage_work(cfg, arg) ? fail("--stage-work", arg) : 0;
    case OPT_MEMCPY_EVERY: return set_int("--memcpy-every", arg, 0, &cfg->memcpy_every);
    case OPT_LOSS_EVERY: return set_int("--loss-every", arg, 0, &cfg->loss_every);
    case OPT_JITTER: return set_ms("--jitter-ms", arg, &cfg->jitter_ns);
    case OPT_WORKERS: return set_int("--workers", arg, 0, &cfg->workers);
    case OPT_EPOCH: return set_int("--epoch-steps", arg, 1, &cfg->epoch_steps);
    case OPT_INPUT: cfg->input_path = arg; return 0;
    case OPT_INPUT_KB: return set_kb(cfg, arg);
    case OPT_WORKER_CPU: return set_ms("--worker-cpu-ms", arg, &cfg->worker_cpu_ns);
    case OPT_INPUT_STALL: return set_ms("--input-stall-ms", arg, &cfg->input_stall_ns);
    case OPT_STEP_MS: return set_ms("--step-ms", arg, &cfg->step_compute_ns);
    case OPT_HOST_WORK: return set_ms("--host-work-ms", arg, &cfg->host_work_ns);
    case OPT_BYTES: return set_bytes(cfg, arg);
    case OPT_DTYPE: return parse_datatype(arg, &cfg->datatype) ? fail("--dtype", arg) : 0;
    case OPT_EXTRA: return parse_extras(arg, &cfg->extras) ? fail("--extra", arg) : 0;
    case OPT_DELAY: return add_delay(cfg, arg);
    case OPT_RECORD: cfg->record_path = arg; return 0;
    case OPT_UNIQUE_ID: cfg->unique_id_path = arg; return 0;
    case OPT_HELP: fputs(usage_text, stdout); exit(EXIT_OK);
    default: fputs(usage_text, stderr); return EXIT_USAGE;
    }
}

static void set_defaults(struct rank_config *cfg)
{
    *cfg = (struct rank_config){
        .steps = 10, .step_compute_ns = 20000000, .kernels = 4, .allreduce_bytes = 4194304,
        .datatype = ncclFloat32, .host_work_ns = 500000, .die_at = -1, .hang_at = -1,
        .restart_at = -1, .tp = 1, .pp = 1, .sync_every = 1, .buckets = 1, .gemm_share = 0.15,
        .graphs_from = -1,
        .memcpy_every = 5, .loss_every = 1, .input_bytes = 256 * 1024,
        .worker_cpu_ns = 1000000,
    };
}

int rank_config_parse(struct rank_config *cfg, int argc, char **argv)
{
    set_defaults(cfg);
    read_identity(cfg);
    int id, status;
    while ((id = getopt_long(argc, argv, "", options, NULL)) != -1)
        if ((status = apply_option(cfg, id, optarg)) != 0)
            return status;
    if (optind < argc)
        return fail("argument", argv[optind]);
    if (!cfg->record_path || !cfg->unique_id_path)
        return fail("command line", "--record and --unique-id-file are required");
    if (cfg->rank >= cfg->world_size)
        return fail("RANK", "must be below WORLD_SIZE");
    if (cfg->world_size % (cfg->tp * cfg->pp) || cfg->pp > MAX_STAGES)
        return fail("--tp/--pp", "must divide the world size (at most 16 stages)");
    if (cfg->subgroups && cfg->tp * cfg->pp > 1)
        return fail("--subgroup", "not with --tp/--pp");
    if (cfg->loop == LOOP_PYTORCH && (cfg->tp * cfg->pp > 1 || cfg->subgroups || cfg->extras))
        return fail("--loop", "pytorch takes no --tp/--pp, --subgroup or --extra");
    if (cfg->graphs_from >= 0 && (cfg->loop != LOOP_SIM || cfg->tp * cfg->pp > 1))
        return fail("--graphs-from", "takes the sim loop, without --tp/--pp");
    if (cfg->buckets > MAX_BUCKETS)
        return fail("--buckets", "more than 64");
    if (cfg->stage_works && cfg->stage_works != cfg->pp)
        return fail("--stage-work", "needs one value per pipeline stage");
    for (int i = cfg->stage_works; i < cfg->pp; i++)
        cfg->stage_work_ns[i] = cfg->step_compute_ns;
    if (cfg->first_step >= cfg->steps)
        return fail("--first-step", "must be below --steps");
    if (cfg->workers > MAX_WORKERS)
        return fail("--workers", "more than 16");
    if (cfg->workers && !cfg->input_path)
        return fail("command line", "--workers needs --input");
    return 0;
}
