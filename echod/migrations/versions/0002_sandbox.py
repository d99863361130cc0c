"""Tenancy for the SQL sandbox: a private signing key, ``ingero_scope()`` and row-level security
on every table that holds cluster data.

echod signs the clusters a caller may see into the setting ``ingero.scope`` as
``<signature>.<json>``, the json being ``{"clusters": [...], "pid": <backend pid>, "t": "<now()
as text>"}`` and the signature the hex SHA-256 of ``key || '.' || json``. ``ingero_scope()``
returns those clusters only when the signature, the backend and the transaction all match, and
an empty array otherwise, so a value typed in by hand, copied from another session or kept
from an earlier transaction opens nothing. (A length-extension forgery would have to append
SHA-256 padding, whose zero bytes no text setting can hold.) The table owner and superusers
bypass row-level security, so echod's writer is unaffected.

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TENANT_TABLES = ("events", "health_scores", "thresholds", "peer_lag", "straggler_verdicts",
                 "jobs", "nodes")
POLICY = "tenant_read"

# 64 hex digits, 244 random bits (gen_random_uuid draws from the server's strong random source).
RANDOM_KEY = "replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', '')"

# plpgsql rather than sql so that the order is explicit: the claim is parsed as JSON only after
# its signature has been checked.
SCOPE_FUNCTION = """
CREATE FUNCTION ingero_scope() RETURNS text[]
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    claim text := coalesce(current_setting('ingero.scope', true), '');
    signature text := split_part(claim, '.', 1);
    body text := substr(claim, length(signature) + 2);
    scope jsonb;
BEGIN
    IF signature IS DISTINCT FROM (
            SELECT encode(sha256(convert_to(k.key || '.' || body, 'UTF8')), 'hex')
            FROM public.sandbox_key AS k) THEN
        RETURN '{}';
    END IF;
    scope := body::jsonb;
    IF (scope ->> 'pid')::integer IS DISTINCT FROM pg_backend_pid()
            OR scope ->> 't' IS DISTINCT FROM now()::text
            OR jsonb_typeof(scope -> 'clusters') IS DISTINCT FROM 'array' THEN
        RETURN '{}';
    END IF;
    RETURN array(SELECT jsonb_array_elements_text(scope -> 'clusters'));
END
$body$
"""

# The scalar sub-selects become InitPlans: ingero_scope() runs once per query, not once per row.
POLICY_USING = ("(SELECT '*' = ANY (ingero_scope())) "
                "OR cluster = ANY ((SELECT ingero_scope())::text[])")


def upgrade() -> None:
    op.create_table(
        "sandbox_key",
        sa.Column("id", sa.Boolean, server_default=sa.true(), nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_sandbox_key"),
        sa.CheckConstraint("id", name="ck_sandbox_key_one_row"),
    )
    op.execute(f"INSERT INTO sandbox_key (key) VALUES ({RANDOM_KEY})")
    op.execute("REVOKE ALL ON sandbox_key FROM PUBLIC")
    op.execute(SCOPE_FUNCTION)
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(f"CREATE POLICY {POLICY} ON {table} FOR SELECT TO PUBLIC "
                   f"USING ({POLICY_USING})")


def downgrade() -> None:
    for table in TENANT_TABLES:
        op.execute(f"DROP POLICY {POLICY} ON {table}")
        op.execute(f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
    op.execute("DROP FUNCTION ingero_scope()")
    op.drop_table("sandbox_key")
