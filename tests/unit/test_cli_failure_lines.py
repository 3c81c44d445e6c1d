"""The last line of a failed ``magnetar`` tool (magnetar/tools/failure.py), in process,
without a server.

Proves: the line is one line whatever the broker's reason holds, and ends with the
catalogue tag; an admin error body's code wins over the status's class, and a body
without one (or no answer) gets the class that stands for the status;
``archive verify`` of a file that is no archive ends with ArchiveCorrupt's tag and
still prints its JSON report; a command line the tool refuses ends with
InvalidArgument's tag.
"""

from __future__ import annotations

import json

from magnetar.cli import build_parser
from magnetar.tools.admin_client import AdminError
from magnetar.tools.failure import failure_line, report_admin_error


def _run(argv: list[str]) -> int:
    args = build_parser(argv).parse_args(argv)
    return args.handler(args)


def test_the_line_is_one_line_ending_with_the_tag():
    line = failure_line("consume", "subscribing to t", "subscription s is Shared,\n  not Exclusive", "NotAllowed", 4006)
    assert line == "magnetar consume: subscribing to t: subscription s is Shared, not Exclusive [NotAllowed, code 4006]"


def test_admin_errors_take_the_bodys_code_or_the_statuss_class(capsys):
    report_admin_error("admin", AdminError("PUT", "http://b/x", 404, "tenant t does not exist", code=4015,
                                           error="TenantNotFound"))
    report_admin_error("admin", AdminError("GET", "http://b/y", 404, "Not Found"))
    report_admin_error("admin", AdminError("GET", "http://b/z", None, "cannot reach the server"))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "magnetar admin: PUT http://b/x: HTTP 404: tenant t does not exist [TenantNotFound, code 4015]"
    assert lines[1].endswith("HTTP 404: Not Found [NotFound, code 1006]")
    assert lines[2].endswith("no response: cannot reach the server [ServiceNotReady, code 5003]")


def test_archive_verify_of_a_file_that_is_no_archive(tmp_path, capsys):
    bad = tmp_path / "bad.arrow"
    bad.write_bytes(b"not arrow at all")
    assert _run(["archive", "verify", "--file", f"file://{bad}"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["corrupt"] == 1
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("magnetar archive: verify: 1 of 1 files failed: archive file") and \
        last.endswith("[ArchiveCorrupt, code 6001]"), last


def test_a_refused_command_line_ends_with_invalid_argument(capsys):
    code = _run(["admin", "namespaces", "set-persistence", "public/default", "--ensemble", "1",
                 "--write-quorum", "2", "--ack-quorum", "1"])
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("[InvalidArgument, code 1002]")
