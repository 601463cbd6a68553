"""Directory entries <-> topic views (pure, no slapd) and the role helper."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from directory import mapping
from directory.mapping import Entry, EntryError
from directory.roles import ADMIN, ANALYST, OPERATOR, has_role

FIELDS = list(mapping.TOPIC_ATTRS)


def entry(**attrs: str | list[str]) -> Entry:
    values = {
        k: [v.encode() for v in (a if isinstance(a, list) else [a])] for k, a in attrs.items()
    }
    return Entry(
        dn="cn=X,ou=topics,dc=hpwsn,dc=local", attrs={"objectClass": [b"hpwsnTopic"], **values}
    )


def test_a_topic_entry_round_trips_through_its_view():
    view = mapping.topic_view(
        entry(
            hpwsnTopicName="ALARM1",
            hpwsnReliability="FAST",
            hpwsnOrdered="TRUE",
            hpwsnRetrySchedule="1, 5,30",
            hpwsnPriority="9",
            hpwsnPublishGroups=["b-group", "a-group"],
            hpwsnAnonymousSubscribe="FALSE",
        ),
        parent_path="ALL:ALARM",
        fields=FIELDS,
    )
    assert view["path"] == "ALL:ALARM:ALARM1"
    assert (view["reliability"], view["ordered"], view["retry_schedule"]) == (
        "fast",
        True,
        "1,5,30",
    )
    assert (view["priority"], view["ttl_seconds"], view["description"]) == (9, None, "")
    assert view["publish_groups"] == "a-group,b-group"
    assert view["anonymous_subscribe"] is False
    again = Entry(dn="cn=ALARM1,x", attrs=mapping.topic_attrs(view))
    assert mapping.topic_view(again, parent_path="ALL:ALARM", fields=FIELDS) == view


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({}, "no name"),
        ({"hpwsnTopicName": "A:B"}, "invalid topic name"),
        ({"hpwsnTopicName": "A", "hpwsnReliability": "sometimes"}, "unknown hpwsnReliability"),
        ({"hpwsnTopicName": "A", "hpwsnRetrySchedule": "1,soon"}, "hpwsnRetrySchedule must be"),
        ({"hpwsnTopicName": "A", "hpwsnRetrySchedule": "1,-5"}, "negative delay"),
        ({"hpwsnTopicName": "A", "hpwsnPriority": "12"}, "hpwsnPriority must be 0..9"),
        ({"hpwsnTopicName": "A", "hpwsnTtlSeconds": "-1"}, "hpwsnTtlSeconds must be 0.."),
        # Past the column: on SQLite the save raised OverflowError, which no one caught, and the
        # sync stopped at the entry at every start.
        (
            {"hpwsnTopicName": "A", "hpwsnTtlSeconds": "1" + "0" * 20},
            "hpwsnTtlSeconds must be 0..2147483647",
        ),
        ({"hpwsnTopicName": "A", "hpwsnFragmentSize": "2147483648"}, "hpwsnFragmentSize must be"),
        ({"hpwsnTopicName": "x" * 129}, "longer than 128"),
    ],
)
def test_a_malformed_topic_entry_is_refused_with_the_reason(attrs, reason):
    with pytest.raises(EntryError, match=reason):
        mapping.topic_view(entry(**attrs), parent_path=None, fields=FIELDS)


def test_only_a_root_keeps_its_namespace():
    e = entry(hpwsnTopicName="A", hpwsnNamespace="urn:x")
    assert mapping.topic_view(e, parent_path=None, fields=FIELDS)["namespace"] == "urn:x"
    assert mapping.topic_view(e, parent_path="R", fields=FIELDS)["namespace"] == ""


def user(*groups: str, superuser: bool = False, active: bool = True) -> SimpleNamespace:
    names = SimpleNamespace(values_list=lambda *_a, **_k: list(groups))
    return SimpleNamespace(
        is_authenticated=True, is_active=active, is_superuser=superuser, groups=names
    )


def test_roles_follow_the_groups_and_higher_roles_include_lower_ones():
    assert has_role(user("hpwsn-operators"), ANALYST)
    assert not has_role(user("hpwsn-operators"), ADMIN)
    assert has_role(user(superuser=True), OPERATOR)
    assert not has_role(user("alarm-publishers"), ANALYST)
    assert not has_role(user("hpwsn-admins", active=False), ANALYST)
    with pytest.raises(ValueError, match="unknown role"):
        has_role(user(), "janitor")


REGISTRATION = {
    "id": "0b7e2a52-77a4-4a3c-9d55-5b9b8f0b1e11",
    "publisher_address": "http://sensor-7.example/wsn",
    "reference_address": "http://broker.example/wsn/registrations/0b7e2a52-77a4-4a3c-9d55-5b9b8f0b1e11",
    "topic_paths": ["ALL:ALARM", "Object:Food"],
    "demand": True,
    "owner": "user:publisher1",
    "termination_time": "20991231235959Z",
    "created_at": "20260101120000Z",
}


def registration_entry(attrs: dict[str, list[bytes]]) -> Entry:
    return Entry(dn="hpwsnRegistrationId=x,ou=registrations,dc=hpwsn,dc=local", attrs=attrs)


def test_a_registration_view_round_trips_through_its_entry():
    attrs = mapping.registration_attrs(REGISTRATION)

    assert attrs["objectClass"] == [b"hpwsnPublisherRegistration"]
    assert attrs["hpwsnTopicPath"] == [b"ALL:ALARM", b"Object:Food"]
    assert attrs["hpwsnDemand"] == [b"TRUE"]
    assert mapping.registration_view_of_entry(registration_entry(attrs)) == REGISTRATION


def test_a_registration_for_every_topic_and_without_an_end_has_no_such_attributes():
    view = {**REGISTRATION, "topic_paths": [], "termination_time": "", "demand": False}
    attrs = mapping.registration_attrs(view)

    assert attrs["hpwsnTopicPath"] == []
    assert attrs["hpwsnTerminationTime"] == []
    present = {k: v for k, v in attrs.items() if v}
    assert mapping.registration_view_of_entry(registration_entry(present)) == view


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"hpwsnRegistrationId": []}, "no hpwsnRegistrationId"),
        ({"hpwsnRegistrationId": [b"not-a-uuid"]}, "is not a UUID"),
        ({"hpwsnPublisherAddress": []}, "no hpwsnPublisherAddress"),
        ({"hpwsnDemand": [b"yes"]}, "hpwsnDemand must be TRUE or FALSE"),
        ({"hpwsnTerminationTime": [b"tomorrow"]}, "bad hpwsnTerminationTime"),
    ],
)
def test_a_malformed_registration_entry_is_refused_with_the_reason(change, reason):
    attrs = {**mapping.registration_attrs(REGISTRATION), **change}

    with pytest.raises(EntryError, match=reason):
        mapping.registration_view_of_entry(registration_entry(attrs))
