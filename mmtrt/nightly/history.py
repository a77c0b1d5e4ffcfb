"""The history: every night and every recipe's result in a database through SQLAlchemy (an SQLite file by
default, any server by URL). A night is written in one transaction, so an interrupted run leaves it as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import (JSON, Column, ForeignKey, Integer, MetaData, String, Table, Text, create_engine, insert,
                        select)
from sqlalchemy.exc import SQLAlchemyError

from mmtrt.errors import UserError

metadata = MetaData()

nights = Table(
    "nights", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("label", String(64), nullable=False),
    Column("started_at", String(32), nullable=False),
    Column("finished_at", String(32), nullable=False),
    Column("host", String(255), nullable=False),
    Column("mmtrt_version", String(32), nullable=False),
    Column("config_sha256", String(64), nullable=False),
    Column("shards", Integer, nullable=False),
    Column("regressions", Integer, nullable=False),
)

results = Table(
    "results", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("night_id", Integer, ForeignKey("nights.id"), nullable=False, index=True),
    Column("recipe", String(128), nullable=False, index=True),
    Column("status", String(16), nullable=False),  # ok | failed
    Column("error", Text),
    Column("cache", String(16)),  # hit | miss
    Column("cache_key", String(64)),
    Column("inputs", JSON),
    Column("changed", JSON),
    Column("bundle_sha256", String(64)),
    Column("metrics", JSON, nullable=False),
    Column("fired", JSON, nullable=False),
)

RESULT_FIELDS = [c.name for c in results.columns if c.name not in ("id", "night_id")]


def history_url(value: str, base: Path) -> str:
    """An SQLAlchemy URL as given, or a file path (relative to NIGHTLY.yaml) as an SQLite URL."""
    if "://" in value:
        return value
    path = (base / value).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


class History:
    def __init__(self, url: str):
        self.url = url
        try:
            self.engine = create_engine(url)
            metadata.create_all(self.engine)
        except (SQLAlchemyError, ImportError) as exc:
            raise UserError(f"cannot open the history {url} ({str(exc).splitlines()[0]}); check `history:` or "
                            "--history (and install the database driver)") from None

    def record(self, night: dict[str, Any], rows: list[dict[str, Any]]) -> int:
        """The night and all its results, or nothing."""
        with self.engine.begin() as conn:
            night_id = conn.execute(insert(nights).values(**night)).inserted_primary_key[0]
            for row in rows:
                conn.execute(insert(results).values(night_id=night_id, **{k: row.get(k) for k in RESULT_FIELDS}))
        return night_id

    def _latest(self, recipe: str, *where) -> dict[str, Any] | None:
        query = (select(results).where(results.c.recipe == recipe, *where).order_by(results.c.night_id.desc())
                 .limit(1))
        with self.engine.connect() as conn:
            row = conn.execute(query).mappings().first()
        return dict(row) if row else None

    def baseline(self, recipe: str) -> dict[str, Any] | None:
        """The last good night of the recipe: built, measured, and no rule fired."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(results).where(results.c.recipe == recipe, results.c.status == "ok")
                                .order_by(results.c.night_id.desc())).mappings()
            return next((dict(r) for r in rows if not r["fired"]), None)

    def last_inputs(self, recipe: str) -> dict[str, Any] | None:
        row = self._latest(recipe, results.c.inputs.is_not(None))
        return row["inputs"] if row else None

    def hash_for_key(self, recipe: str, key: str) -> str | None:
        """The bundle hash an earlier build with the same inputs gave."""
        row = self._latest(recipe, results.c.cache_key == key, results.c.bundle_sha256.is_not(None))
        return row["bundle_sha256"] if row else None

    def series(self) -> list[dict[str, Any]]:
        """Every result with its night's id and label, oldest first: what the plots draw."""
        query = (select(nights.c.label, results).join(nights, nights.c.id == results.c.night_id)
                 .order_by(results.c.night_id))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def night_count(self) -> int:
        with self.engine.connect() as conn:
            return len(conn.execute(select(nights.c.id)).all())
