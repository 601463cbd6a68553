"""Schemathesis against the live /api/schema/ with a real token: no 5xx, no answer off-schema."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx

from tests.api.conftest import PASSWORD

VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def _forget_since(started: datetime) -> None:
    """Unsubscribe what the run subscribed: made-up consumers on 127.0.0.1 must not receive the
    later tests' messages on ports those tests' consumers may take."""
    from subscriptions.models import PublisherRegistration, PullPoint, Subscription
    from subscriptions.services import pull_point_destroy, subscription_delete

    for sub_id in Subscription.objects.filter(created_at__gte=started).values_list("id", flat=True):
        subscription_delete(subscription_id=str(sub_id))
    for pp_id in PullPoint.objects.filter(
        created_at__gte=started, destroyed_at__isnull=True
    ).values_list("id", flat=True):
        pull_point_destroy(pull_point_id=str(pp_id))
    # Registrations could make later Notify messages from these made-up publishers acceptable.
    PublisherRegistration.objects.filter(created_at__gte=started).delete()


def test_schemathesis_finds_no_server_error_and_no_schema_violation(platform, tmp_path, committed):  # type: ignore[no-untyped-def]
    # An analyst reads everything and may publish and subscribe where anonymous callers may:
    # the run covers every operation without rebuilding the demo tree under the other tests.
    token = httpx.post(
        platform.base_url + "/api/v1/tokens",
        json={"name": "schemathesis"},
        auth=("analyst1", PASSWORD),
        timeout=30,
    ).json()["token"]
    started = datetime.now(UTC)
    try:
        run = _run(platform.base_url, token, tmp_path)
    finally:
        committed(_forget_since, started)
    (ROOT / "test-output").mkdir(exist_ok=True)
    (ROOT / "test-output" / "schemathesis.txt").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def _run(base_url: str, token: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            str(VENV_BIN / "schemathesis"), "run", base_url + "/api/schema/",
            "--url", base_url,
            "--header", f"Authorization: Bearer {token}",
            "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance",
            "--phases", "examples,coverage,fuzzing",
            "--max-examples", "12",
            "--seed", "20261124",
            "--workers", "1",
            "--request-timeout", "30",
            # Revoking its own token would leave the rest of the run unauthenticated.
            "--exclude-operation-id", "token_revoke",
            "--suppress-health-check", "all",
            "--report", "junit", "--report-dir", str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )  # fmt: skip
