"""Placeholder."""

from __future__ import annotations

from .context import Ctx
from .util import Row


def steps(ctx: Ctx) -> int:
    return 0


def run(ctx: Ctx) -> list[Row]:
    return []
