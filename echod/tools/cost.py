"""What late ranks cost: GPU time idle at collectives, priced at published on-demand rates."""

from __future__ import annotations

from sqlalchemy import Connection, text

from ingero.rates import load_rates, usd

from .lag import Survey
from .schema import BOOL, INT, NUM_OR_NULL, STR, STR_OR_NULL, array, closed
from .selection import Selection, num

# Published on-demand prices per GPU-hour: the one table fleetd prices verdicts with
# (``ingero/rates.yaml``, as shipped). List prices, not anyone's bill.
GPU_RATES = {(gpu, provider): price for gpu, providers in load_rates().items()
             for provider, price in providers.items()}
GPUS = sorted({gpu for gpu, _ in GPU_RATES})
PROVIDERS = sorted({provider for _, provider in GPU_RATES})

VERDICT_COST = "SELECT sum(v.cost_gpu_seconds) FROM straggler_verdicts v WHERE {where}"


def gpu_rate(args: dict) -> tuple[float | None, str | None]:
    """(USD per GPU-hour, where it came from): the explicit rate, else the table's."""
    if "usd_per_gpu_hour" in args:
        return float(args["usd_per_gpu_hour"]), "explicit"
    rate = GPU_RATES.get((args.get("gpu"), args.get("provider")))
    return (rate, f"table:{args['gpu']}/{args['provider']}") if rate is not None else (None, None)


def cost_summary(conn: Connection, sel: Selection, found: Survey, rate: float | None,
                 source: str | None, limit: int = 100) -> dict:
    """GPU time idle at collectives because of late ranks, attributed to the rank that arrived
    last, scaled from the instances examined to all of them when a stride was used."""
    total = found.idle_total * found.scale
    culprits = sorted((r for r in found.ranks if r.idle_caused > 0),
                      key=lambda r: -r.idle_caused)[:limit]
    attributed = sum(r.idle_caused for r in found.ranks) or 1.0
    verdicts = sel.where("v", time="t", node=False, rank=False)
    verdict_seconds = conn.execute(text(VERDICT_COST.format(where=verdicts.sql())),
                                   verdicts.params).scalar()
    return {
        "gpu_seconds_idle": num(total, 3), "gpu_hours_idle": num(total / 3600.0, 6),
        "usd_per_gpu_hour": rate, "rate_source": source, "usd": usd(total, rate),
        "estimated": found.stride > 1,
        "verdicts_gpu_seconds": num(verdict_seconds, 3),
        "by_rank": [{"cluster": r.cluster, "job": r.job, "rank": r.rank, "node": r.node,
                     "last_arrivals": r.last_arrivals,
                     "gpu_seconds": num(r.idle_caused * found.scale, 3),
                     "share": num(r.idle_caused / attributed, 4),
                     "usd": usd(r.idle_caused * found.scale, rate)} for r in culprits],
    }


COST_OUT = closed({
    "gpu_seconds_idle": NUM_OR_NULL, "gpu_hours_idle": NUM_OR_NULL,
    "usd_per_gpu_hour": NUM_OR_NULL, "rate_source": STR_OR_NULL, "usd": NUM_OR_NULL,
    "estimated": BOOL, "verdicts_gpu_seconds": NUM_OR_NULL,
    "by_rank": array(closed({"cluster": STR, "job": STR, "rank": INT, "node": STR_OR_NULL,
                             "last_arrivals": INT, "gpu_seconds": NUM_OR_NULL,
                             "share": NUM_OR_NULL, "usd": NUM_OR_NULL}))})

RATE_ARGS = {
    "usd_per_gpu_hour": {"type": "number", "exclusiveMinimum": 0, "maximum": 10_000,
                         "description": "Price of one GPU-hour in USD; overrides gpu/provider."},
    "gpu": {"type": "string", "enum": GPUS,
            "description": "GPU model, to price with the provider's published on-demand rate."},
    "provider": {"type": "string", "enum": PROVIDERS, "description": "Cloud provider."},
}
