"""SQL for a user proven by MUNGE, over their own jobs only.

The sandbox's signed claim (``ingero.scope``, migration 0002) may now name a Unix user beside
the clusters. ``ingero_claim()`` checks the signature once for both; ``ingero_scope()`` reads
the clusters from it as before, ``ingero_user()`` the user (NULL for a token). A restrictive
policy on every table the sandbox reads then keeps, for a named user, the rows of the jobs
the ``jobs`` table says are theirs (the Slurm prolog recorded the user), and no row of the
tables that belong to no job (``thresholds``, ``nodes``). Without a user in the claim the
policies let everything through that the clusters do. Catalog changes only: nothing is
rewritten, however large the tables.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

import importlib

from alembic import op

sandbox = importlib.import_module("echod.migrations.versions.0002_sandbox")

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

POLICY = "own_jobs"
JOB_TABLES = ("event_rows", "event_chunks", "health_scores", "peer_lag", "straggler_verdicts",
              "call_stats")
NO_JOB_TABLES = ("thresholds", "nodes")

# 0002's check of the signed claim, answering the claim itself (the JSON, or {} when forged,
# stale or absent) instead of its clusters.
def _claim_function() -> str:
    text = sandbox.SCOPE_FUNCTION
    for old, new in (("CREATE FUNCTION ingero_scope() RETURNS text[]",
                      "CREATE FUNCTION ingero_claim() RETURNS jsonb"),
                     ("\n            OR jsonb_typeof(scope -> 'clusters') IS DISTINCT FROM 'array' "
                      "THEN", " THEN"),
                     ("RETURN array(SELECT jsonb_array_elements_text(scope -> 'clusters'));",
                      "RETURN scope;")):
        assert old in text, old
        text = text.replace(old, new)
    return text


SCOPE_FUNCTION = """
CREATE OR REPLACE FUNCTION ingero_scope() RETURNS text[]
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
    SELECT CASE WHEN jsonb_typeof(c -> 'clusters') = 'array'
                THEN array(SELECT jsonb_array_elements_text(c -> 'clusters'))
                ELSE '{}'::text[] END
    FROM public.ingero_claim() AS c
$body$
"""

USER_FUNCTION = """
CREATE FUNCTION ingero_user() RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
    SELECT c ->> 'user' FROM public.ingero_claim() AS c
$body$
"""

# Scalar sub-selects, so that ingero_user() runs once per query (an InitPlan), not per row.
NO_USER = "(SELECT ingero_user()) IS NULL"
OWN_JOB = (f"{NO_USER} OR EXISTS (SELECT 1 FROM jobs j WHERE j.cluster = {{table}}.cluster "
           "AND j.id = {table}.job AND j.\"user\" = (SELECT ingero_user()))")


def upgrade() -> None:
    op.execute(_claim_function())
    op.execute(SCOPE_FUNCTION)
    op.execute(USER_FUNCTION)
    using = {"jobs": f"{NO_USER} OR \"user\" = (SELECT ingero_user())",
             **{table: OWN_JOB.format(table=table) for table in JOB_TABLES},
             **{table: NO_USER for table in NO_JOB_TABLES}}
    for table, condition in using.items():
        op.execute(f"CREATE POLICY {POLICY} ON {table} AS RESTRICTIVE FOR SELECT TO PUBLIC "
                   f"USING ({condition})")


def downgrade() -> None:
    for table in ("jobs", *JOB_TABLES, *NO_JOB_TABLES):
        op.execute(f"DROP POLICY {POLICY} ON {table}")
    op.execute("DROP FUNCTION ingero_user()")
    # 0002's function, which checks the signature itself, before ingero_claim() goes
    op.execute(sandbox.SCOPE_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
    op.execute("DROP FUNCTION ingero_claim()")
