"""Driving an ``EnvPool`` (environment or agent workers) from a synchronous test."""

from __future__ import annotations

import asyncio


def drive(pool, body):
    """``body(pool)`` on a fresh event loop; the pool is shut down whatever happens."""

    async def main():
        try:
            return await body(pool)
        finally:
            await pool.shutdown()

    return asyncio.run(main())
