"""Analysts see over REST what they see in the console: no address that grants anything.

A subscription's, pull point's or registration's id is in the address that renews, ends or reads
it, and what an anonymous caller made, anyone holding the id may act on. An analyst (read-only)
therefore sees a tag and a consumer's host:port for what it does not own; its own, operators'
and admins' views are in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from console.services import pull_point_remove
from tests.api.conftest import tag_of
from tests.support import ANONYMOUS_ALLOWED, topic_with_policy

TOPIC = "APIMASK:Door"
SECRET_HOOK = "http://127.0.0.1:9/hook?token=s3cret"


@dataclass
class Made:
    anon_pp: dict[str, object]
    anon_pull: dict[str, object]
    anon_push: dict[str, object]
    gone_pp: dict[str, object]
    gone_pull: dict[str, object]
    subscriber_pp: dict[str, object]
    subscriber_pull: dict[str, object]
    analyst_pp: dict[str, object]
    analyst_pull: dict[str, object]
    anon_reg: dict[str, object]
    letter_ids: list[int]

    @property
    def secrets(self) -> list[str]:
        """What no analyst may read: the anonymous pull point's and subscriptions' ids and
        addresses, and the secret in a push consumer's address."""
        return [
            str(self.anon_pp["id"]),
            str(self.anon_pull["id"]),
            str(self.anon_push["id"]),
            str(self.gone_pp["id"]),
            str(self.gone_pull["id"]),
            str(self.subscriber_pp["id"]),
            str(self.subscriber_pull["id"]),
            str(self.anon_reg["id"]),
            "s3cret",
        ]


def _ok(r: httpx.Response, status: int = 200) -> dict[str, object]:
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def _letters(sub_id: str) -> list[int]:
    from dispatch.models import DeadLetter

    return [
        DeadLetter.objects.create(
            subscription_id=sub_id,
            consumer_address=SECRET_HOOK,
            notification_id=f"n-mask-{n}",
            topic=TOPIC,
            message=b"<m/>",
            reason="exhausted",
            attempts=[{"time": 0, "status": 503, "detail": "unavailable", "duration_ms": 1}],
        ).id
        for n in range(3)
    ]


@pytest.fixture
def made(api, committed):  # type: ignore[no-untyped-def]
    committed(topic_with_policy, TOPIC, root=ANONYMOUS_ALLOWED)

    def pull(user: str | None) -> tuple[dict[str, object], dict[str, object]]:
        pp = _ok(api.call("POST", "/pullpoints", user), 201)
        body = {"pullpoint": pp["id"], "topic": TOPIC}
        return pp, _ok(api.call("POST", "/subscriptions", user, json=body), 201)

    anon_pp, anon_pull = pull(None)
    subscriber_pp, subscriber_pull = pull("subscriber1")
    analyst_pp, analyst_pull = pull("analyst1")
    push = {"consumer": SECRET_HOOK, "topic": TOPIC}
    anon_push = _ok(api.call("POST", "/subscriptions", None, json=push), 201)
    gone_pp, gone_pull = pull(None)
    reg = {"publisher": "http://sensor-mask.example/wsn", "topics": [TOPIC]}
    anon_reg = _ok(api.call("POST", "/registrations", None, json=reg), 201)
    letter_ids = committed(_letters, str(anon_push["id"]))

    # Audited: an operator's pause, pull point removal, redrive and deletion.
    _ok(api.call("POST", f"/subscriptions/{anon_push['id']}:pause", "operator1"))
    committed(pull_point_remove, pull_point_id=str(gone_pp["id"]), actor="operator1")
    assert api.call("DELETE", f"/deadletters/{letter_ids[2]}", "operator1").status_code == 204
    _ok(api.call("POST", "/deadletters:redrive", "operator1", json={"ids": letter_ids[:1]}))
    redrive = {"subscription": anon_push["id"]}
    _ok(api.call("POST", "/deadletters:redrive", "operator1", json=redrive))

    yield Made(
        anon_pp=anon_pp,
        anon_pull=anon_pull,
        anon_push=anon_push,
        gone_pp=gone_pp,
        gone_pull=gone_pull,
        subscriber_pp=subscriber_pp,
        subscriber_pull=subscriber_pull,
        analyst_pp=analyst_pp,
        analyst_pull=analyst_pull,
        anon_reg=anon_reg,
        letter_ids=letter_ids,
    )
    for pp in (anon_pp, subscriber_pp, analyst_pp):
        api.call("DELETE", f"/pullpoints/{pp['id']}", "operator1")
    api.call("DELETE", f"/subscriptions/{anon_push['id']}", "operator1")
    api.call("DELETE", f"/registrations/{anon_reg['id']}", "operator1")


def _results(r: httpx.Response) -> list[dict[str, object]]:
    return _ok(r)["results"]  # type: ignore[return-value]


def _by_id(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["id"]: row for row in rows}


def test_an_analyst_sees_tags_for_what_others_made_and_its_own_in_full(api, made):  # type: ignore[no-untyped-def]
    subs = _by_id(_results(api.call("GET", "/subscriptions?limit=1000", "analyst1")))
    pps = _by_id(_results(api.call("GET", "/pullpoints?limit=1000", "analyst1")))

    for other in (made.anon_pull, made.subscriber_pull):
        shown = subs[tag_of(other["id"])]
        assert shown["reference"] is None
        assert "/" not in str(shown["consumer"])
        assert shown["pullpoint"] == tag_of(other["pullpoint"])
    push = subs[tag_of(made.anon_push["id"])]
    assert (push["consumer"], push["reference"]) == ("127.0.0.1:9", None)
    for other in (made.anon_pp, made.subscriber_pp):
        assert pps[tag_of(other["id"])]["address"] is None
    own_sub = subs[made.analyst_pull["id"]]
    assert (own_sub["reference"], own_sub["consumer"], own_sub["pullpoint"]) == (
        made.analyst_pull["reference"],
        made.analyst_pp["address"],
        made.analyst_pp["id"],
    )
    assert pps[made.analyst_pp["id"]]["address"] == made.analyst_pp["address"]

    detail = _ok(api.call("GET", f"/subscriptions/{made.anon_pull['id']}", "analyst1"))
    assert (detail["id"], detail["reference"]) == (tag_of(made.anon_pull["id"]), None)
    assert detail["pullpoint"] == tag_of(made.anon_pp["id"])
    pp = _ok(api.call("GET", f"/pullpoints/{made.anon_pp['id']}", "analyst1"))
    assert (pp["id"], pp["address"]) == (tag_of(made.anon_pp["id"]), None)
    own = _ok(api.call("GET", f"/pullpoints/{made.analyst_pp['id']}", "analyst1"))
    assert (own["id"], own["address"]) == (made.analyst_pp["id"], made.analyst_pp["address"])

    regs = _by_id(_results(api.call("GET", "/registrations?limit=1000", "analyst1")))
    reg = regs[tag_of(made.anon_reg["id"])]
    assert reg["reference"] is None
    assert reg["publisher"] == made.anon_reg["publisher"]


def test_an_analyst_finds_no_id_or_address_of_what_others_made_where_an_operator_does(api, made):  # type: ignore[no-untyped-def]
    prefix = str(made.anon_pp["id"])[:8]
    letter = made.letter_ids[0]
    paths = [
        "/subscriptions?limit=1000",
        f"/subscriptions?consumer={prefix}",
        "/subscriptions?consumer=pullpoints",
        "/subscriptions?consumer=s3cret",
        "/subscriptions?consumer=127.0.0.1:9&limit=1000",
        "/subscriptions?mode=pull&limit=1000",
        f"/subscriptions/{made.anon_pull['id']}",
        f"/subscriptions/{made.anon_push['id']}",
        "/pullpoints?limit=1000",
        f"/pullpoints/{made.anon_pp['id']}",
        "/deadletters?limit=1000",
        f"/deadletters?subscription={made.anon_push['id']}",
        f"/deadletters/{letter}",
        "/audit?limit=1000",
        f"/audit?object={prefix}",
        f"/audit?object={str(made.anon_push['id'])[:8]}",
        "/audit?object_type=pullpoint",
        "/audit?object_type=deadletter",
        "/registrations?limit=1000",
        f"/registrations/{made.anon_reg['id']}",
        "/consumers",
    ]
    bodies = {path: api.call("GET", path, "analyst1") for path in paths}

    for path, r in bodies.items():
        assert r.status_code == 200, (path, r.text)
        leaked = [s for s in made.secrets if s in r.text]
        assert not leaked, (path, leaked)
    # A substring of an address that grants something matches nothing: no count spells it out.
    assert bodies[f"/subscriptions?consumer={prefix}"].json()["results"] == []
    assert bodies["/subscriptions?consumer=s3cret"].json()["results"] == []
    by_host = bodies["/subscriptions?consumer=127.0.0.1:9&limit=1000"].json()["results"]
    assert tag_of(made.anon_push["id"]) in [s["id"] for s in by_host]  # what it sees, it finds
    found = bodies["/subscriptions?consumer=pullpoints"].json()["results"]
    assert made.analyst_pull["id"] in [s["id"] for s in found]  # its own, in full
    assert not [s for s in found if str(s["id"]).startswith("#")]
    assert bodies[f"/audit?object={prefix}"].json()["results"] == []
    # What is left to see is tagged.
    audit = bodies["/audit?limit=1000"].text
    assert tag_of(made.anon_push["id"]) in audit
    assert tag_of(made.gone_pp["id"]) in audit
    assert tag_of(made.anon_push["id"]) in bodies["/deadletters?limit=1000"].text
    # ... and found by its tag, as the console finds a pull point by its tag.
    by_tag = api.call(
        "GET", "/deadletters", "analyst1", params={"subscription": tag_of(made.anon_push["id"])}
    )
    assert {d["id"] for d in _results(by_tag)} == set(made.letter_ids[:2])
    assert str(made.anon_push["id"]) not in by_tag.text

    # An operator sees and finds all of it.
    subs = _by_id(_results(api.call("GET", "/subscriptions?limit=1000", "operator1")))
    pps = _by_id(_results(api.call("GET", "/pullpoints?limit=1000", "operator1")))
    assert subs[made.anon_pull["id"]]["reference"] == made.anon_pull["reference"]
    assert subs[made.anon_push["id"]]["consumer"] == SECRET_HOOK
    assert pps[made.anon_pp["id"]]["address"] == made.anon_pp["address"]
    assert str(made.anon_push["id"]) in api.call("GET", "/deadletters", "operator1").text
    assert str(made.gone_pp["id"]) in api.call("GET", "/audit", "operator1").text
    found = _results(api.call("GET", f"/subscriptions?consumer={prefix}", "operator1"))
    assert [s["id"] for s in found] == [made.anon_pull["id"]]


def test_operators_and_owners_still_act_on_what_they_may(api, made):  # type: ignore[no-untyped-def]
    anon_push = made.anon_push["id"]
    resumed = _ok(api.call("POST", f"/subscriptions/{anon_push}:resume", "operator1"))
    assert (resumed["id"], resumed["state"]) == (anon_push, "active")
    pp = made.subscriber_pp["id"]
    pulled = api.call("POST", f"/pullpoints/{pp}/messages:pull", "subscriber1", json={})
    assert pulled.status_code == 200, pulled.text
    paused = _ok(api.call("POST", f"/subscriptions/{made.analyst_pull['id']}:pause", "analyst1"))
    assert (paused["id"], paused["reference"]) == (
        made.analyst_pull["id"],
        made.analyst_pull["reference"],
    )
    # What an anonymous caller made, an analyst holding its id may act on; the answer is tagged.
    other = _ok(api.call("POST", f"/subscriptions/{made.anon_pull['id']}:pause", "analyst1"))
    assert (other["id"], other["reference"]) == (tag_of(made.anon_pull["id"]), None)
    mine = _ok(api.call("GET", f"/subscriptions/{made.subscriber_pull['id']}", "subscriber1"))
    assert mine["pullpoint"] == made.subscriber_pp["id"]
    assert api.call("DELETE", f"/pullpoints/{made.anon_pp['id']}", None).status_code == 204
