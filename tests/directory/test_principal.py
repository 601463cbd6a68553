"""A Django user (REST, console) as the broker's caller: the same owner as over SOAP."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from directory.roles import principal_of_user
from tests.console.conftest import make_user
from topics.acl import may_act_on

pytestmark = pytest.mark.django_db


def test_a_directory_user_owns_what_it_made_over_soap_and_nothing_else():
    person = principal_of_user(make_user("subscriber1", "alarm-subscribers"))

    assert person.owner == "user:subscriber1"
    assert may_act_on(person, "user:subscriber1")
    assert not may_act_on(person, "user:publisher1")
    assert may_act_on(person, "anonymous")


def test_a_web_login_in_another_case_is_the_same_owner():
    # django-auth-ldap keeps the user name as typed; the directory compares uids without case.
    person = principal_of_user(make_user("Subscriber1", "alarm-subscribers"))

    assert may_act_on(person, "user:subscriber1")


@pytest.mark.parametrize(
    ("groups", "superuser", "allowed"),
    [
        (("hpwsn-operators",), False, True),
        (("hpwsn-admins",), False, True),
        ((), True, True),
        (("hpwsn-analysts",), False, False),
    ],
)
def test_operators_admins_and_superusers_act_on_anything_analysts_do_not(
    groups, superuser, allowed
):
    user = make_user(f"staff-{'-'.join(groups) or 'super'}", *groups)
    user.is_superuser = superuser
    user.save(update_fields=["is_superuser"])

    assert may_act_on(principal_of_user(user), "user:subscriber1") is allowed


def test_a_visitor_without_a_login_is_anonymous():
    principal = principal_of_user(AnonymousUser())

    assert principal.anonymous
    assert not may_act_on(principal, "user:subscriber1")
