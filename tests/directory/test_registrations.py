"""Publisher registrations are mirrored under ou=registrations, also across a directory outage,
and directory_reconcile repairs them both ways."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.directory.helpers import (
    BASE,
    BR,
    entry,
    ldapdelete,
    ldif,
    reconcile_output,
    register,
    soap_as,
)
from tests.support import SoapResult, wait_until

pytestmark = pytest.mark.integration

REGISTRATIONS = f"ou=registrations,{BASE}"


def registration_dn(reg_id: str) -> str:
    return f"hpwsnRegistrationId={reg_id},{REGISTRATIONS}"


def destroy(address: str, auth: tuple[str, str] | None = None) -> SoapResult:
    return soap_as(address, f"<wsnbr:DestroyRegistration {BR}/>", auth)


def written(directory, reg_id: str) -> dict[str, list[str]]:  # type: ignore[no-untyped-def]
    """The registration's entry once it is written and no write of it is pending."""
    from directory.models import RegistrationWrite

    assert wait_until(lambda: entry(directory, registration_dn(reg_id)) is not None, timeout=15)
    assert wait_until(
        lambda: not RegistrationWrite.objects.filter(registration_id=reg_id).exists(), timeout=15
    )
    found = entry(directory, registration_dn(reg_id))
    assert found is not None
    return found


def directory_status(platform) -> str:  # type: ignore[no-untyped-def]
    return str(
        httpx.get(platform.base_url + "/healthz", timeout=5).json()["checks"]["directory"]["status"]
    )


def test_a_registration_is_written_renewed_and_removed_in_the_directory(
    platform, ldap_directory, db_access, dir_root
):
    from subscriptions.models import PublisherRegistration

    auth = ("publisher1", ldap_directory.demo_password("publisher1"))
    publisher = f"http://sensor-{uuid.uuid4().hex[:8]}.example/wsn"
    reg_id, address = register(platform, publisher, dir_root, termination="PT1H", auth=auth)

    attrs = written(ldap_directory, reg_id)
    reg = PublisherRegistration.objects.get(id=reg_id)
    assert attrs["objectClass"] == ["hpwsnPublisherRegistration"]
    assert attrs["hpwsnRegistrationId"] == [reg_id]
    assert attrs["hpwsnPublisherAddress"] == [publisher]
    assert attrs["hpwsnTopicPath"] == [dir_root]
    assert attrs["hpwsnDemand"] == ["FALSE"]
    assert attrs["hpwsnOwner"] == ["user:publisher1"]
    assert attrs["hpwsnReferenceAddress"] == [address]
    assert attrs["hpwsnTerminationTime"] == [reg.termination_time.strftime("%Y%m%d%H%M%SZ")]
    assert attrs["hpwsnCreatedTime"] == [reg.created_at.strftime("%Y%m%d%H%M%SZ")]

    renewed = soap_as(
        address,
        "<wsnt:Renew><wsnt:TerminationTime>2099-06-30T12:00:00Z</wsnt:TerminationTime>"
        "</wsnt:Renew>",
        auth,
    )
    assert renewed.status == 200, renewed.body
    assert wait_until(
        lambda: (
            (entry(ldap_directory, registration_dn(reg_id)) or {}).get("hpwsnTerminationTime")
            == ["20990630120000Z"]
        ),
        timeout=15,
    ), platform.logs()

    gone = destroy(address, auth)
    assert gone.status == 200, gone.body
    assert wait_until(lambda: entry(ldap_directory, registration_dn(reg_id)) is None, timeout=15)


def test_an_expired_registration_leaves_the_directory(
    platform, ldap_directory, db_access, dir_root
):
    from subscriptions.models import PublisherRegistration

    reg_id, _address = register(platform, "http://short-lived.example/wsn", dir_root)
    written(ldap_directory, reg_id)
    # Time enough for its entry to be written first.
    reg_id2, _address = register(
        platform, "http://short-lived.example/wsn", dir_root, termination="PT5S"
    )
    written(ldap_directory, reg_id2)

    # The expiry sweep (beat, every 5 s) ends it; its entry goes with it, the other one stays.
    assert wait_until(
        lambda: not PublisherRegistration.objects.filter(id=reg_id2).exists(), timeout=30
    ), platform.logs()
    assert wait_until(lambda: entry(ldap_directory, registration_dn(reg_id2)) is None, timeout=15)
    assert entry(ldap_directory, registration_dn(reg_id)) is not None
    assert destroy(_registration_address(reg_id)).status == 200


def _registration_address(reg_id: str) -> str:
    from subscriptions.models import PublisherRegistration

    return PublisherRegistration.objects.get(id=reg_id).reference_address


def test_with_the_directory_down_a_registration_is_accepted_and_written_when_it_returns(
    platform, ldap_directory, db_access, dir_root
):
    from directory.models import RegistrationWrite

    assert wait_until(lambda: directory_status(platform) == "ok", timeout=15), platform.logs()
    ldap_directory.stop()
    try:
        started = time.monotonic()
        reg_id, address = register(platform, "http://while-down.example/wsn", dir_root)
        print(f"RegisterPublisher with the directory down: {time.monotonic() - started:.3f} s")
        # The flush tried, failed and kept the write for later.
        assert wait_until(
            lambda: RegistrationWrite.objects.filter(
                registration_id=reg_id, attempts__gt=0
            ).exists(),
            timeout=15,
        ), platform.logs()
    finally:
        ldap_directory.start()
    attrs = written(ldap_directory, reg_id)
    assert attrs["hpwsnPublisherAddress"] == ["http://while-down.example/wsn"]
    assert destroy(address).status == 200
    assert wait_until(lambda: entry(ldap_directory, registration_dn(reg_id)) is None, timeout=15)


def test_reconcile_reports_registration_drift_and_repairs_it_both_ways(
    platform, ldap_directory, db_access, committed, dir_root
):
    from subscriptions.models import PublisherRegistration

    def reconcile(*args: str) -> str:
        return str(committed(reconcile_output, *args))

    d = ldap_directory
    auth = ("publisher1", d.demo_password("publisher1"))
    kept, kept_address = register(platform, "http://kept.example/wsn", dir_root, auth=auth)
    edited, _ = register(platform, "http://edited.example/wsn", dir_root, termination="PT1H")
    for reg_id in (kept, edited):
        written(d, reg_id)
    stray = str(uuid.uuid4())

    # Drift behind the broker's back: an entry deleted, one edited, one that is no registration.
    ldapdelete(d, registration_dn(kept))
    ldif(d, f"dn: {registration_dn(edited)}\nchangetype: modify\n"
            "replace: hpwsnTerminationTime\nhpwsnTerminationTime: 20990101000000Z\n")  # fmt: skip
    ldif(d, f"dn: {registration_dn(stray)}\nobjectClass: hpwsnPublisherRegistration\n"
            f"hpwsnRegistrationId: {stray}\nhpwsnPublisherAddress: http://stray.example/wsn\n"
            "hpwsnTopicPath: ALL\nhpwsnDemand: FALSE\nhpwsnOwner: anonymous\n"
            "hpwsnCreatedTime: 20260101000000Z\n", tool="ldapadd")  # fmt: skip

    report = reconcile()
    assert f"registration {kept}: only in Django" in report, report
    assert f"registration {edited}: differs: termination_time (Django '" in report
    assert "directory '20990101000000Z')" in report
    assert f"registration {stray}: only in the directory" in report

    dry = reconcile("--direction", "django-to-ldap", "--dry-run")
    assert f"write registration {kept} to the directory" in dry, dry
    assert entry(d, registration_dn(kept)) is None, "a dry run changed something"

    fixed = reconcile("--direction", "django-to-ldap")
    assert f"delete registration {stray} from the directory" in fixed, fixed
    # (Another test's registration expiring meanwhile may show for a moment.)
    assert wait_until(lambda: "registration " not in reconcile(), timeout=15), reconcile()
    assert entry(d, registration_dn(kept))["hpwsnOwner"] == ["user:publisher1"]  # type: ignore[index]
    assert entry(d, registration_dn(stray)) is None
    in_django = PublisherRegistration.objects.get(id=edited).termination_time
    assert entry(d, registration_dn(edited))["hpwsnTerminationTime"] == [  # type: ignore[index]
        in_django.strftime("%Y%m%d%H%M%SZ")
    ]

    # The other way: the directory is right. A row lost from the database, one edited there, and
    # one the directory never had.
    committed(lambda: PublisherRegistration.objects.filter(id=kept).delete())
    ldif(d, f"dn: {registration_dn(edited)}\nchangetype: modify\n"
            "replace: hpwsnTerminationTime\nhpwsnTerminationTime: 20990101000000Z\n")  # fmt: skip
    unknown = committed(
        lambda: PublisherRegistration.objects.create(
            publisher_address="http://unknown.example/wsn", topic_paths=[dir_root]
        )
    )

    fixed = reconcile("--direction", "ldap-to-django")
    assert f"restore registration {kept} in Django from the directory" in fixed, fixed
    assert f"update registration {edited} in Django from the directory" in fixed
    assert f"delete registration {unknown.id} in Django" in fixed
    assert wait_until(lambda: "registration " not in reconcile(), timeout=15), reconcile()
    restored = PublisherRegistration.objects.get(id=kept)
    assert (restored.publisher_address, restored.topic_paths, restored.owner) == (
        "http://kept.example/wsn",
        [dir_root],
        "user:publisher1",
    )
    assert restored.reference_address == kept_address
    assert PublisherRegistration.objects.get(id=edited).termination_time.year == 2099
    assert not PublisherRegistration.objects.filter(id=unknown.id).exists()

    # The restored registration is the publisher's again, at the address it was given.
    refused = destroy(kept_address)
    assert refused.fault_name == "NotAuthorized", refused.body
    assert destroy(kept_address, auth).status == 200
    assert destroy(_registration_address(edited)).status == 200


def test_registrations_lost_from_the_database_are_restored_at_start_up(
    platform, ldap_directory, db_access, committed, dir_root
):
    from directory.services import directory_load
    from subscriptions.models import PublisherRegistration

    reg_id, address = register(
        platform, "http://restored.example/wsn", dir_root, termination="PT1H"
    )
    written(ldap_directory, reg_id)
    ends = PublisherRegistration.objects.get(id=reg_id).termination_time.replace(microsecond=0)
    committed(lambda: PublisherRegistration.objects.filter(id=reg_id).delete())

    report = committed(directory_load)

    assert reg_id in report.restored
    restored = PublisherRegistration.objects.get(id=reg_id)
    assert (restored.publisher_address, restored.topic_paths) == (
        "http://restored.example/wsn",
        [dir_root],
    )
    assert restored.termination_time == ends
    assert restored.broker_address == f"{platform.base_url}/wsn/"
    assert destroy(address).status == 200
