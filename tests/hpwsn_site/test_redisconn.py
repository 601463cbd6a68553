"""Where the site's Redis is (hpwsn_site/redisconn.py): a URL, or a master behind Sentinel."""

from __future__ import annotations

import pytest

from hpwsn_site.redisconn import RedisTarget, sentinels_parse

SENTINELS = (("10.0.0.1", 26379), ("10.0.0.2", 26380))


def test_it_reads_the_sentinel_list():
    assert sentinels_parse(" 10.0.0.1:26379, 10.0.0.2:26380 ,") == SENTINELS
    assert sentinels_parse("[::1]:26379") == (("::1", 26379),)
    assert sentinels_parse("") == ()


@pytest.mark.parametrize("bad", ["10.0.0.1", "10.0.0.1:", ":26379", "h:port", "h:70000", "h:0"])
def test_it_refuses_a_sentinel_that_is_not_host_and_port(bad):
    with pytest.raises(ValueError, match=r"REDIS_SENTINELS: .* is not host:port"):
        sentinels_parse(bad)


def test_without_sentinels_everything_uses_the_url():
    t = RedisTarget(url="redis://:secret@redis.example:6380/3")
    assert t.celery_broker_url() == "redis://:secret@redis.example:6380/3"
    assert t.celery_transport_options() == {}
    assert t.channel_layer_host() == "redis://:secret@redis.example:6380/3"
    assert t.describe() == "redis://redis.example:6380/3"


def test_with_sentinels_celery_finds_the_master_through_each_of_them():
    t = RedisTarget(url="redis://:s%40cret@ignored/2", sentinels=SENTINELS, master="site1")
    assert t.celery_broker_url() == (
        "sentinel://:s%40cret@10.0.0.1:26379;sentinel://:s%40cret@10.0.0.2:26380/2"
    )
    assert t.celery_transport_options()["master_name"] == "site1"
    # kombu reads the password back as it was given
    from kombu.utils.url import parse_url

    assert parse_url(t.celery_broker_url().split(";")[0])["password"] == "s@cret"


def test_with_sentinels_the_channels_layer_gets_the_master_name_db_and_password():
    t = RedisTarget(url="redis://:pw@ignored/5", sentinels=SENTINELS, master="site1")
    host = t.channel_layer_host()
    assert isinstance(host, dict)
    assert host["sentinels"] == list(SENTINELS)
    assert (host["master_name"], host["db"], host["password"]) == ("site1", 5, "pw")
    assert "pw" not in t.describe()
    assert t.describe() == "sentinel site1 via 10.0.0.1:26379,10.0.0.2:26380, db 5"


def test_it_refuses_a_database_that_is_not_a_number():
    with pytest.raises(ValueError, match="REDIS_URL: the database 'x' is not a number"):
        RedisTarget(url="redis://h/x", sentinels=SENTINELS).channel_layer_host()


def test_a_sentinel_client_asks_the_sentinels_for_the_master():
    client = RedisTarget(url="redis://ignored/4", sentinels=SENTINELS, master="site1").client()
    pool = client.connection_pool
    assert pool.service_name == "site1"
    assert pool.connection_kwargs["db"] == 4
    assert [
        (c.connection_pool.connection_kwargs["host"]) for c in pool.sentinel_manager.sentinels
    ] == [
        "10.0.0.1",
        "10.0.0.2",
    ]


def test_a_sentinel_client_never_holds_one_connection():
    # Its pool is what asks the sentinels for the master: a connection held by the client
    # would connect again to the old master after a failover (tests/integration/test_sentinel.py).
    target = RedisTarget(url="redis://ignored/4", sentinels=SENTINELS, master="site1")
    assert target.client(single_connection=True).connection is None
    assert RedisTarget(url="redis://127.0.0.1:6379/15").client(single_connection=True).connection


def test_the_asyncio_client_packs_with_hiredis_what_redis_py_packs_in_python():
    from redis.asyncio.connection import Connection

    client = RedisTarget(url="redis://127.0.0.1:6379/15").async_client()
    hiredis = client.connection_pool.make_connection()
    assert type(hiredis).__name__ == "HiredisConnection"
    args = ("EVALSHA", "abc", 3, b"k\x00ey", "clé", 1.5, 0, -7, b"", "")
    assert b"".join(hiredis.pack_command(*args)) == b"".join(Connection().pack_command(*args))
    sentinel = RedisTarget(url="redis://ignored/4", sentinels=SENTINELS, master="site1")
    assert sentinel.async_client().connection_pool.connection_class.__name__ == (
        "HiredisSentinelManagedConnection"
    )


def test_the_asyncio_client_runs_scripts_with_many_arguments(settings):
    import asyncio

    values = [f"v{i}-é".encode() if i % 2 else i for i in range(500)]

    async def echo() -> list[bytes]:
        client = RedisTarget(url=settings.REDIS_URL).async_client()
        try:
            return await client.eval("return ARGV", 0, *values)
        finally:
            await client.aclose()

    assert asyncio.run(echo()) == [v if isinstance(v, bytes) else str(v).encode() for v in values]
