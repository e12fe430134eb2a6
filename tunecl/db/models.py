"""All SQLAlchemy models of the tuning database (schema revision: see ``migrations/versions``).

Any change here needs a new Alembic revision in ``tunecl/db/migrations/versions`` and a checked-in DB
file of the old revision under ``tests/data`` (the migration tests open it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


class UTCDateTime(TypeDecorator[dt.datetime]):
    """A timestamp stored as naive UTC and read back as an aware UTC ``datetime``.

    SQLite keeps no time zone, so every backend gets the same naive-UTC column and the conversion
    happens here, once.
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be time-zone aware (use datetime.now(datetime.UTC))")
        return value.astimezone(dt.UTC).replace(tzinfo=None)

    def process_result_value(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        return None if value is None else value.replace(tzinfo=dt.UTC)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    # fixed constraint names, so migrations can refer to them on every backend
    metadata = MetaData(naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    })


class DeviceModel(Base):
    """One OpenCL device model on one driver, identified by ``Fingerprint.key``."""

    __tablename__ = "tunecl_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    model_key: Mapped[str] = mapped_column(String(64), index=True)
    fingerprint: Mapped[dict[str, Any]] = mapped_column(JSON)
    label: Mapped[str] = mapped_column(String(256))

    results: Mapped[list[ResultModel]] = relationship(back_populates="device")


class ProblemModel(Base):
    """One problem, identified by its canonical ``Problem.key``."""

    __tablename__ = "tunecl_problems"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    kind: Mapped[str] = mapped_column(String(16))

    results: Mapped[list[ResultModel]] = relationship(back_populates="problem")


class ResultModel(Base):
    """The best configuration of one algorithm (at one version and precision) for a problem on a device.

    ``status`` is ``"ok"`` for a verified result, ``"failed:<reason>"`` otherwise; only ok results are
    ever served. ``time_s`` is the median time of the config in ``params`` (NULL for a failure).
    """

    __tablename__ = "tunecl_results"
    __table_args__ = (
        UniqueConstraint("device_id", "problem_id", "algorithm", "algorithm_version", "precision",
                         name="uq_tunecl_results_natural_key"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("tunecl_devices.id", ondelete="CASCADE"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("tunecl_problems.id", ondelete="CASCADE"),
                                            index=True)
    algorithm: Mapped[str] = mapped_column(String(64))
    algorithm_version: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    precision: Mapped[str] = mapped_column(String(16), default="fp32")
    status: Mapped[str] = mapped_column(String(512), default="ok")
    time_s: Mapped[float | None] = mapped_column(Float)
    default_time_s: Mapped[float | None] = mapped_column(Float)
    trials: Mapped[int] = mapped_column(Integer, default=0)
    tunecl_version: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utc_now)
    origin: Mapped[str] = mapped_column(String(512))

    device: Mapped[DeviceModel] = relationship(back_populates="results")
    problem: Mapped[ProblemModel] = relationship(back_populates="results")
