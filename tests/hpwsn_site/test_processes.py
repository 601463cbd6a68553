"""The node's command lines (hpwsn_site/processes.py) and the role switch of make run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpwsn_site import processes

ROOT = Path(__file__).resolve().parents[2]


def _opts(**kwargs: object) -> processes.Options:
    return processes.Options(bin_dir=Path("/v/bin"), data_dir=Path("/d"), **kwargs)  # type: ignore[arg-type]


def test_it_names_the_worker_after_the_node():
    argv = processes.command("worker", _opts(node_name="node-a", concurrency=3))
    assert argv[:4] == ["/v/bin/celery", "-A", "hpwsn_site", "worker"]
    assert argv[argv.index("-n") + 1] == "node-a@%h"
    assert argv[argv.index("--concurrency") + 1] == "3"


def test_it_takes_the_node_name_from_the_environment(monkeypatch):
    monkeypatch.setenv("HPWSN_NODE_NAME", "from-env")
    argv = processes.command("worker", _opts())
    assert argv[argv.index("-n") + 1] == "from-env@%h"


def test_it_serves_the_web_on_the_given_address():
    argv = processes.command("web", _opts(host="0.0.0.0", port=8123, web_workers=4))
    assert argv == ["/v/bin/python", "-m", "hpwsn_site.serve", "--host", "0.0.0.0",
                    "--port", "8123", "--workers", "4"]  # fmt: skip


def test_beat_keeps_its_schedule_in_the_data_dir():
    argv = processes.command("beat", _opts())
    assert argv[argv.index("--schedule") + 1] == "/d/celerybeat-schedule"


def test_it_refuses_an_unknown_role():
    with pytest.raises(ValueError, match="unknown role 'spooler'"):
        processes.command("spooler", _opts())


@pytest.mark.parametrize(
    ("switch", "roles"),
    [
        ("", processes.ROLES),
        ("all", processes.ROLES),
        ("worker", ("worker",)),
        (" beat , WEB ", ("web", "beat")),  # start order, whatever the order given
    ],
)
def test_it_reads_the_role_switch(switch, roles):
    assert processes.roles_parse(switch) == roles


def test_it_refuses_a_switch_naming_an_unknown_role():
    with pytest.raises(ValueError, match="unknown role\\(s\\) spooler"):
        processes.roles_parse("web,spooler")


def test_the_command_line_prints_one_argument_a_line():
    done = subprocess.run(
        [sys.executable, "-m", "hpwsn_site.processes", "worker", "--node-name", "n1",
         "--bin-dir", "/v/bin"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == processes.command(
        "worker", processes.Options(bin_dir=Path("/v/bin"), node_name="n1")
    )


def test_the_command_line_refuses_a_bad_role_switch():
    done = subprocess.run(
        [sys.executable, "-m", "hpwsn_site.processes", "roles", "web,spooler"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "HPWSN_ROLES: unknown role(s) spooler" in done.stderr
