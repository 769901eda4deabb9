"""A launch's actor ids: claimed in the buffer before its actors start, renewed while they
run (buffer/actor_ids.py has the claims and their invariants)."""

from __future__ import annotations

import os
import signal
import threading
import time

from asyncrl.core.config.job import Config
from asyncrl.core.runtime.waiting import Wait


class IdKeeper:
    """Claims ``actor.num_actors`` of the job's ``actor.total`` ids for this launch and
    renews them every ``ttl/3`` in a daemon thread. If another launch took one (this host was
    cut off longer than ``buffer.lease_ttl_s``), it says so, records the ids in ``lost`` and
    stops this launch (SIGTERM to itself): two actors with one id would deal the same prompts.
    ``close()`` releases the ids, so a relaunch need not wait out the TTL."""

    def __init__(self, cfg: Config, url: str, run_dir, say=print) -> None:
        from asyncrl.buffer.actor_ids import ActorIds, launch_token
        from asyncrl.buffer.connection import connect, mask_url

        self.cfg, self.say, self.where = cfg, say, mask_url(url)
        self.ttl_s = cfg.buffer.lease_ttl_s
        self.claims = ActorIds(
            connect(url), cfg.buffer.name, cfg.actor.total, launch_token(run_dir), self.ttl_s
        )
        self.ids: list[int] = []
        self.lost: list[int] = []  # set before the SIGTERM: the launcher's reason to stop
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def claim(self, stop=lambda: False) -> list[int]:
        """Wait (up to ``lease_ttl_s`` + 30 s, saying why) for this launch's ids."""
        want = self.cfg.actor.num_actors
        wait = Wait(
            f"{want} free actor id(s) in buffer {self.cfg.buffer.name!r}",
            self.ttl_s + 30.0,
            self.say,
            stop,
            hint=(
                f"the job has actor.nnodes={self.cfg.actor.nnodes} x actor.num_actors={want} "
                "ids; a launch that died frees its ids within buffer.lease_ttl_s. Check that "
                "no more `asyncrl launch actors` run than actor.nnodes"
            ),
        )
        first = True
        while True:
            self.ids = self._retried(lambda: self.claims.claim(want), stop)
            if len(self.ids) == want:
                break
            if first:  # said only when the ids are not free at once
                wait.begin(f"{len(self.ids)}/{want} free")
                first = False
            wait.check(f"{len(self.ids)}/{want} claimed; held: {sorted(self.claims.holders())}")
            time.sleep(1.0)
        self._thread = threading.Thread(target=self._renew_loop, name="actor-ids", daemon=True)
        self._thread.start()
        return self.ids

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                lost = self.claims.renew(self.ids)
            except Exception as e:  # noqa: BLE001 (Redis unreachable, a partition: next period)
                if not self._stop.is_set():  # not the call close() cut short
                    self.say(f"[asyncrl] cannot renew actor ids {self.ids} ({e}); retrying")
                continue
            if lost:
                self.lost = lost
                self.say(f"[asyncrl] {self.lost_reason()}; stopping this launch's actors")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def lost_reason(self) -> str:
        return (
            f"actor id(s) {self.lost} were taken by another launch while this one could not "
            f"renew them (longer than buffer.lease_ttl_s={self.ttl_s}s): no id may run twice"
        )

    def _retried(self, fn, stop=lambda: False):
        """``fn()`` with Redis reconnects for up to ``buffer.reconnect_s``; a Redis error that
        retrying cannot fix becomes a ``BufferUnavailable`` naming the server."""
        import redis

        from asyncrl.buffer.connection import BufferUnavailable, call_with_retries

        try:
            return call_with_retries(fn, self.where, self.cfg.buffer.reconnect_s, stop=stop)
        except redis.RedisError as e:
            raise BufferUnavailable(f"claiming actor ids at {self.where} failed: {e}") from None

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop renewing and release the ids this launch still holds. Best effort: one try,
        each wait bounded by ``timeout_s``; ids it cannot release come free after
        ``buffer.lease_ttl_s`` anyway."""
        self._stop.set()
        try:
            if self.ids:
                self._release(timeout_s)
        except Exception as e:  # noqa: BLE001 (best effort: the TTL frees them anyway)
            self.say(
                f"[asyncrl] could not release actor ids {self.ids} at {self.where} ({e}); "
                f"they come free after buffer.lease_ttl_s={self.ttl_s}s"
            )
        finally:
            self.claims.client.close()

    def _release(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)  # a renewal landing after the release would retake
            if self._thread.is_alive():
                raise TimeoutError(f"a renewal still waits for Redis after {timeout_s}s")
        pool = self.claims.client.connection_pool  # ours alone now: short waits from here
        pool.connection_kwargs.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        pool.disconnect()
        self.claims.release(self.ids)


def interrupted(keeper: IdKeeper | None, reason: str) -> tuple[int, str]:
    """Exit code and reason of a launcher stopped by SIGTERM/Ctrl-C: ``keeper``'s own SIGTERM
    (another launch took one of its ids) is a failure (1) naming the ids; else 130, ``reason``."""
    if keeper is not None and keeper.lost:
        return 1, keeper.lost_reason()
    return 130, reason
