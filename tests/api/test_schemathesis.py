"""Schemathesis against the live /api/schema/ with a real token: no 5xx, no answer off-schema."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.api.conftest import PASSWORD

VENV_BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def test_schemathesis_finds_no_server_error_and_no_schema_violation(platform, tmp_path):  # type: ignore[no-untyped-def]
    # An analyst reads everything and may publish and subscribe where anonymous callers may:
    # the run covers every operation without rebuilding the demo tree under the other tests.
    token = httpx.post(
        platform.base_url + "/api/v1/tokens",
        json={"name": "schemathesis"},
        auth=("analyst1", PASSWORD),
        timeout=30,
    ).json()["token"]
    run = subprocess.run(
        [
            str(VENV_BIN / "schemathesis"), "run", platform.base_url + "/api/schema/",
            "--url", platform.base_url,
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
    (ROOT / "test-output").mkdir(exist_ok=True)
    (ROOT / "test-output" / "schemathesis.txt").write_text(run.stdout + run.stderr)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
