"""The sync round: one at a time per site."""

from __future__ import annotations

import json

import pytest

from federation.peers import peers_parse
from federation.services import federation_sync
from hpwsn_site import state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def unreachable_peer(settings):  # type: ignore[no-untyped-def]
    # Nothing listens on port 9: a round records the failure in the site registry.
    settings.HPWSN_SITE_NAME = "a"
    settings.HPWSN_FEDERATION_PEERS = peers_parse("b=http://127.0.0.1:9", own="a")
    r = state.get_redis()
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)
    yield r
    r.delete(state.FEDERATION_PEERS, state.FEDERATION_SYNC_LOCK)


def test_a_round_does_nothing_while_another_runs_and_runs_once_it_is_done(unreachable_peer):
    r = unreachable_peer
    r.set(state.FEDERATION_SYNC_LOCK, "another round", px=60_000)
    assert federation_sync() == {}
    assert r.hget(state.FEDERATION_PEERS, "b") is None

    r.delete(state.FEDERATION_SYNC_LOCK)
    errors = federation_sync()
    assert set(errors) == {"b"}
    assert "127.0.0.1:9" in json.loads(r.hget(state.FEDERATION_PEERS, "b"))["last_error"]
    # The round let go of its lock.
    assert r.get(state.FEDERATION_SYNC_LOCK) is None
