"""Running a test's scenario on its own event loop and closing the operator doors it used there."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

__all__ = ["run_closing"]

T = TypeVar("T")


class _Door(Protocol):
    async def close(self) -> None: ...


def run_closing(main: Coroutine[Any, Any, T], *doors: _Door) -> T:
    """``asyncio.run(main)``, then close each door's HTTP session on that loop, as the operator does when
    Kopf stops: a session left open is reported as unclosed when the loop is gone."""

    async def closing() -> T:
        try:
            return await main
        finally:
            for door in doors:
                await door.close()

    return asyncio.run(closing())
