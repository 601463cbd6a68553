"""Where the site's Redis is: one URL, or a master found through Redis Sentinel.

Every Redis client of the broker (its state, the counters, Celery's broker, the Channels layer)
is made from one `RedisTarget`, so a site moves to Sentinel by setting two variables:

- `REDIS_SENTINELS`: `host:port,host:port,...` of the sentinels;
- `REDIS_SENTINEL_MASTER`: the name the sentinels monitor the master under (`mymaster`).

With sentinels, `REDIS_URL` still gives the password and the database number; its host and port
are not used. A client asks the sentinels for the master when it connects and again after a
connection fails or the server it reached turns out to be a replica (after a failover), so
nothing needs restarting when the master moves.

No Django here: settings.py builds the Celery and Channels configuration with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

# A sentinel that does not answer must not hold up the discovery for long: the next is asked.
SENTINEL_SOCKET_TIMEOUT_S = 1.0


def sentinels_parse(text: str) -> tuple[tuple[str, int], ...]:
    """`host:port,host:port` into pairs; a precise error for anything else."""
    pairs = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"REDIS_SENTINELS: {item!r} is not host:port")
        pairs.append((host, int(port)))
    return tuple(pairs)


@dataclass(frozen=True)
class RedisTarget:
    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master: str = "mymaster"
    sentinel_password: str = ""

    @property
    def uses_sentinel(self) -> bool:
        return bool(self.sentinels)

    def _url_parts(self) -> tuple[str | None, str | None, int]:
        parts = urlsplit(self.url)
        db = (parts.path or "/0").strip("/") or "0"
        if not db.isdigit():
            raise ValueError(f"REDIS_URL: the database {db!r} is not a number")
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        return user, password, int(db)

    def _sentinel_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_SOCKET_TIMEOUT_S}
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs

    def _master_kwargs(self) -> dict[str, Any]:
        user, password, db = self._url_parts()
        kwargs: dict[str, Any] = {"db": db}
        if user:
            kwargs["username"] = user
        if password:
            kwargs["password"] = password
        return kwargs

    def client(self, *, single_connection: bool = False, **kwargs: Any) -> Any:
        """A redis-py client of the master (socket options in kwargs). With `single_connection`
        and no Sentinel, its commands go over one connection it holds (redis-py's
        `single_connection_client`), not through its pool; its pipelines still take theirs from
        the pool. Behind Sentinel it always uses its pool: redis-py finds a new master when its
        pool hands a connection out, and a held connection would connect again to the old one
        after a failover (seen with redis-py 8.1)."""
        import redis
        from redis.sentinel import Sentinel

        if not self.uses_sentinel:
            return redis.Redis.from_url(
                self.url, single_connection_client=single_connection, **kwargs
            )
        # redis-py leaves its Sentinel API unannotated.
        sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs())  # type: ignore[no-untyped-call]
        return sentinel.master_for(self.master, **self._master_kwargs(), **kwargs)  # type: ignore[no-untyped-call]

    def async_client(self, **kwargs: Any) -> Any:
        """An asyncio redis-py client of the master."""
        import redis.asyncio as aioredis
        from redis.asyncio.sentinel import Sentinel

        if not self.uses_sentinel:
            return hiredis_packing(aioredis.Redis.from_url(self.url, **kwargs))
        sentinel = Sentinel(list(self.sentinels), sentinel_kwargs=self._sentinel_kwargs())  # type: ignore[no-untyped-call]
        return hiredis_packing(sentinel.master_for(self.master, **self._master_kwargs(), **kwargs))

    def celery_broker_url(self) -> str:
        """kombu's URL: the Redis URL, or `sentinel://h1:p1;sentinel://h2:p2/<db>`."""
        if not self.uses_sentinel:
            return self.url
        user, password, db = self._url_parts()
        auth = f"{quote(user or '', safe='')}:{quote(password, safe='')}@" if password else ""
        hosts = ";".join(f"sentinel://{auth}{_host(h)}:{p}" for h, p in self.sentinels)
        return f"{hosts}/{db}"

    def celery_transport_options(self) -> dict[str, Any]:
        """What kombu's Sentinel transport needs besides the URL (nothing without Sentinel)."""
        if not self.uses_sentinel:
            return {}
        return {"master_name": self.master, "sentinel_kwargs": self._sentinel_kwargs()}

    def channel_layer_host(self) -> str | dict[str, Any]:
        """One entry of channels_redis's `hosts`."""
        if not self.uses_sentinel:
            return self.url
        return {
            "sentinels": list(self.sentinels),
            "master_name": self.master,
            "sentinel_kwargs": self._sentinel_kwargs(),
            **self._master_kwargs(),
        }

    def describe(self) -> str:
        """For logs and the start-up banner, without the password."""
        if not self.uses_sentinel:
            parts = urlsplit(self.url)
            return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
        hosts = ",".join(f"{_host(h)}:{p}" for h, p in self.sentinels)
        return f"sentinel {self.master} via {hosts}, db {self._url_parts()[2]}"


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def hiredis_packing(client: Any) -> Any:
    """`client` (asyncio) packs its commands with hiredis, as redis-py's synchronous client does.

    The asyncio client packs in Python, joining its buffer again for every argument: with the
    hundreds of arguments of the accept script that batches concurrent publications
    (dispatch/accept.py), that was about 6 % of the web process's time a notification.
    """
    from redis.connection import HiredisRespSerializer
    from redis.utils import HIREDIS_AVAILABLE

    if not HIREDIS_AVAILABLE:
        return client
    pool = client.connection_pool
    packer = HiredisRespSerializer()

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        return packer.pack(*args)

    base = pool.connection_class
    pool.connection_class = type(f"Hiredis{base.__name__}", (base,), {"pack_command": pack_command})
    return client
