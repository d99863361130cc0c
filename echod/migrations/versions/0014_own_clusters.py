"""What belongs to no job, for a user proven by MUNGE: the nodes and the cluster's cohort bars of
the clusters where they ran a job, and their own jobs' cohort bars.

Migration 0012 kept, for a named user, no row of ``nodes`` and ``thresholds``. That was safe
for SQL, but the tools find a job's clusters and communicators through ``nodes``, so once every
tool reads under the user's signed claim (not only ``run_analysis``) a user's own job had no
communicator and no lag. Node names, when they were seen and their boot are what ``sinfo``
shows every user; a cluster cohort's bar and the nodes under it are the fleet's, not a job's.
A cohort ``job:<id>`` is that job's, so only its user sees it. Catalog changes only.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30
"""

import importlib

from alembic import op

own = importlib.import_module("echod.migrations.versions.0012_own_jobs")

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# Uncorrelated IN sub-selects, so that each is one hashed SubPlan, made once per query.
OWN = "FROM jobs j WHERE j.\"user\" = (SELECT ingero_user())"
IN_OWN_CLUSTER = f"cluster IN (SELECT j.cluster {OWN})"
USING = {
    "nodes": f"{own.NO_USER} OR {IN_OWN_CLUSTER}",
    "thresholds": f"{own.NO_USER} OR (cohort NOT LIKE 'job:%' AND {IN_OWN_CLUSTER}) "
                  f"OR (cluster, cohort) IN (SELECT j.cluster, 'job:' || j.id {OWN})",
}


def _replace(conditions: dict[str, str]) -> None:
    for table, condition in conditions.items():
        op.execute(f"DROP POLICY {own.POLICY} ON {table}")
        op.execute(f"CREATE POLICY {own.POLICY} ON {table} AS RESTRICTIVE FOR SELECT TO PUBLIC "
                   f"USING ({condition})")


def upgrade() -> None:
    _replace(USING)


def downgrade() -> None:
    _replace(dict.fromkeys(USING, own.NO_USER))
