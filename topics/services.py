"""Writes to the topic tree. Every change bumps the shared version so all processes reload."""

from __future__ import annotations

from django.db import transaction

from hpwsn.topicexpr import TopicExpressionError, split_colon_path
from hpwsn_site import state
from topics.models import Topic

DEMO_TREE: tuple[str, ...] = (
    "ALL:ALARM:ALARM1:ALARM11",
    "ALL:ALARM:ALARM1:ALARM12",
    "ALL:ALARM:ALARM1:ALARM13",
    "ALL:ALARM:ALARM1:ALARM14",
    "ALL:ALARM:ALARM1:ALARM15",
    "ALL:ALARM:ALARM1:ALARM11:ALARM111",
    "ALL:ALARM:ALARM1:ALARM11:ALARM112",
    "ALL:ALARM:ALARM1:ALARM11:ALARM113",
    "ALL:ALARM:ALARM1:ALARM11:ALARM114",
    "ALL:ALARM:ALARM1:ALARM11:ALARM115",
    "ALL:ALARM:ALARM2",
    "ALL1",
    "ALL2",
    "ALL3",
    "Object:Food:Fruit:Apple",
    "Object:Food:Fruit:Pear",
    "Object:Food:Fruit:Grape",
    "Object:Food:Bread",
    "Object:Tool",
)


def topic_create(*, path: str, namespace: str = "", description: str = "") -> Topic:
    """Create a topic and any missing ancestors; an existing topic is returned unchanged."""
    try:
        names = split_colon_path(path)
    except TopicExpressionError as exc:
        raise ValueError(str(exc)) from None
    with transaction.atomic():
        parent: Topic | None = None
        for depth in range(1, len(names) + 1):
            sub_path = ":".join(names[:depth])
            parent, _created = Topic.objects.get_or_create(
                path=sub_path,
                defaults={
                    "name": names[depth - 1],
                    "parent": parent,
                    "namespace": namespace if depth == 1 else "",
                    "description": description if depth == len(names) else "",
                },
            )
        transaction.on_commit(lambda: state.bump(state.VERSION_TOPICS))
    assert parent is not None
    return parent


def topics_load_demo() -> int:
    """Load the thesis's demo trees (idempotent); returns the number of topics in the tree."""
    for path in DEMO_TREE:
        topic_create(path=path)
    return Topic.objects.count()
