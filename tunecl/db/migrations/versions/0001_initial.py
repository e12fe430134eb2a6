"""Initial schema: devices, problems, results.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tunecl_devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("model_key", sa.String(64), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("label", sa.String(256), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tunecl_devices"),
        sa.UniqueConstraint("key", name="uq_tunecl_devices_key"),
    )
    op.create_index("ix_tunecl_devices_model_key", "tunecl_devices", ["model_key"])
    op.create_table(
        "tunecl_problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(512), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_tunecl_problems"),
        sa.UniqueConstraint("key", name="uq_tunecl_problems_key"),
    )
    op.create_table(
        "tunecl_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("algorithm", sa.String(64), nullable=False),
        sa.Column("algorithm_version", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("status", sa.String(512), nullable=False),
        sa.Column("time_s", sa.Float(), nullable=True),
        sa.Column("default_time_s", sa.Float(), nullable=True),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("tunecl_version", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("origin", sa.String(512), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["tunecl_devices.id"], ondelete="CASCADE",
                                name="fk_tunecl_results_device_id_tunecl_devices"),
        sa.ForeignKeyConstraint(["problem_id"], ["tunecl_problems.id"], ondelete="CASCADE",
                                name="fk_tunecl_results_problem_id_tunecl_problems"),
        sa.PrimaryKeyConstraint("id", name="pk_tunecl_results"),
        sa.UniqueConstraint("device_id", "problem_id", "algorithm", "algorithm_version", "precision",
                            name="uq_tunecl_results_natural_key"),
    )
    op.create_index("ix_tunecl_results_problem_id", "tunecl_results", ["problem_id"])


def downgrade() -> None:
    op.drop_index("ix_tunecl_results_problem_id", table_name="tunecl_results")
    op.drop_table("tunecl_results")
    op.drop_table("tunecl_problems")
    op.drop_index("ix_tunecl_devices_model_key", table_name="tunecl_devices")
    op.drop_table("tunecl_devices")
