"""Connecting to Redis, masking secrets in messages, and bounded retries on dropped connections.

Every error a user sees names the server (password replaced by ``***``) and says what to do.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from asyncrl.core.config.network import mask_url

T = TypeVar("T")

_FIX = (
    "start one with `asyncrl launch buffer` (needs redis-server: apt-get install -y "
    "redis-server) or point buffer.url at a reachable server"
)
_TRANSIENT = (redis.ConnectionError, redis.TimeoutError)


class BufferUnavailable(RuntimeError):
    """Redis could not be reached (or refused us) within the allowed time."""


def describe(client: redis.Redis) -> str:
    """A password-free URL-like description of where ``client`` connects."""
    kw = client.connection_pool.connection_kwargs
    auth = ":***@" if kw.get("password") else ""
    if kw.get("path"):
        return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
    scheme = "rediss" if "ssl_ca_certs" in kw or "ssl_cert_reqs" in kw else "redis"
    return (
        f"{scheme}://{auth}{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    )


def connect(
    url: str,
    timeout_s: float = 10.0,
    socket_timeout_s: float = 30.0,
    say: Callable[[str], None] | None = None,
) -> redis.Redis:
    """A binary-safe client for ``url`` that has answered PING, retrying until ``timeout_s``;
    ``say`` (a role's log) hears once that the first try failed and how long it retries.

    ``socket_timeout_s`` bounds every reply wait, so a dead server raises instead of hanging;
    ``ReplayBuffer.read`` keeps its BLOCK time below it. Raises ``BufferUnavailable``.
    """
    deadline = time.monotonic() + timeout_s
    # until the first PONG, a reply wait may not outlast the deadline: a TCP listener that
    # is not Redis (or a hung server) accepts the connection and never answers
    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=min(timeout_s, 5.0),
        socket_timeout=min(timeout_s, socket_timeout_s),
        # We retry ourselves (``call_with_retries``) so the backoff is bounded and visible.
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )
    delay = 0.05
    while True:
        try:
            client.ping()
            break
        except redis.AuthenticationError as e:
            raise _auth_error(url, e) from None
        except redis.ResponseError as e:
            if "NOAUTH" not in str(e):
                raise
            raise _auth_error(url, e) from None
        except _TRANSIENT as e:
            if _tls_refused(e):  # retrying cannot make a certificate verify
                raise BufferUnavailable(
                    f"Redis at {mask_url(url)} has a TLS certificate that does not verify "
                    f"({e}); give the ssl_ca_certs of the `asyncrl launch buffer` that serves it "
                    "(its URL files carry <buffer.tls_dir>/ca.crt) and its advertised address"
                ) from None
            if time.monotonic() + delay > deadline:
                raise BufferUnavailable(
                    f"cannot reach Redis at {mask_url(url)} after {timeout_s:.1f}s ({e}); "
                    f"{_unreachable_hint(url, e)}{_FIX}"
                ) from None
            if say is not None and delay == 0.05:
                say(f"cannot reach Redis at {mask_url(url)} yet ({e}); retrying for up to "
                    f"{timeout_s:.0f} s (buffer.reconnect_s)")  # fmt: skip
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
    client.connection_pool.connection_kwargs["socket_timeout"] = socket_timeout_s
    client.connection_pool.disconnect()  # the next command reconnects with the long timeout
    return client


def _tls_refused(err: Exception) -> bool:
    text = str(err)
    return "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text


def _unreachable_hint(url: str, err: Exception) -> str:
    """What a failed connection's error suggests, as the start of a sentence ("" if nothing)."""
    text = str(err).lower()
    if isinstance(err, redis.TimeoutError) and "reading" in text:
        return (
            "something accepts connections there but does not answer like Redis; check the "
            "host and port of buffer.url, or "
        )
    if url.startswith("redis://") and ("reset by peer" in text or "closed by server" in text):
        return (
            "the server closes plain connections: if it serves TLS (buffer.tls_dir), use the "
            "rediss:// URL file it wrote; else "
        )
    return ""


def _auth_error(url: str, err: Exception) -> BufferUnavailable:
    if not parse_url(url).get("password"):
        return BufferUnavailable(
            f"Redis at {mask_url(url)} requires a password; put it in the URL "
            f"(redis://:PASSWORD@host:port/0) ({err})"
        )
    return BufferUnavailable(
        f"Redis at {mask_url(url)} refused the password ({err}); use the URL that "
        "RedisServer wrote to <run_dir>/redis.url"
    )


def _report(text: str) -> None:
    print(f"[buffer] {text}", file=sys.stderr, flush=True)


def call_with_retries(
    fn: Callable[[], T],
    where: str,
    budget_s: float = 5.0,
    on_retry: Callable[[], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
) -> T:
    """Run ``fn``; on a dropped connection retry with doubling sleeps (50 ms .. 1 s) for up
    to ``budget_s`` seconds, then raise ``BufferUnavailable`` naming ``where`` (a masked URL).
    ``on_retry`` is called after every failed attempt (the reply may have been lost).
    Once ``stop()`` is true (the role was told to stop) a dropped connection is not retried:
    ``BufferUnavailable`` at once, or within one sleep (<= 1 s) of the stop request, so a role
    whose Redis went away with its launcher does not outlive it by ``budget_s``.

    Only connection-level errors are retried; Redis replies such as WRONGTYPE propagate at
    once. A retried call may have run on the server before the connection dropped, so only
    use it for idempotent or guarded operations (see ``ReplayBuffer``).
    """
    start = time.monotonic()
    deadline = start + budget_s
    delay = 0.05
    lost = False
    while True:
        try:
            result = fn()
            if lost:
                _report(f"reconnected to Redis at {where} after {time.monotonic() - start:.1f}s")
            return result
        except redis.AuthenticationError:
            raise  # a subclass of ConnectionError, but retrying a wrong password cannot help
        except _TRANSIENT as e:
            if on_retry is not None:
                on_retry()
            if stop():
                raise BufferUnavailable(
                    f"lost connection to Redis at {where} while stopping ({e}); not retrying"
                ) from None
            if not lost and budget_s >= 1.0:  # a partition or a restart: say so, once
                lost = True
                _report(
                    f"lost connection to Redis at {where} ({e}); retrying for up to "
                    f"{budget_s:.0f}s (buffer.reconnect_s)"
                )
            if time.monotonic() + delay > deadline:
                raise BufferUnavailable(
                    f"lost connection to Redis at {where} and could not reconnect within "
                    f"{budget_s:.1f}s ({e}); {_FIX}"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
