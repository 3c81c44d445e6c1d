"""Whether a read task belongs to the query its partitions were planned for.

Why this exists: on pyspark 4.1-4.3 a Python data source's planned read (the pickled
reader and its partitions) is cached on the DataFrame's source object, and a query
with no filters to push does not plan again: an unfiltered ``count()`` after a
filtered one on the same DataFrame runs the *filtered* plan (measured on 4.3.0: 10
rows of 100). A reader that pruned with pushed filters would return the filtered rows.

So a plan made with pushed filters carries a token, and its partitions keep every file
(those the filters prune are marked, not dropped). The first Spark SQL execution that
runs a task of the plan claims the token (an atomic create of a marker file naming the
execution id); tasks of that execution apply the filters; tasks of any later execution
run the plan as if nothing was pushed, and read every row the options select. That is
right because Spark plans again (a new token) for every query that has filters to
push, so a later execution reusing a token pushed none, and Spark evaluates whatever
filters it has itself.

The marker directory must be one every task of a query sees: local mode (one machine)
uses a temporary directory; on a cluster, option ``planStateDir`` names a shared one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid

EXECUTION_ID_PROPERTY = "spark.sql.execution.id"


def default_directory() -> str:
    return os.path.join(tempfile.gettempdir(), "magnetar-spark-plans")


def current_execution_id() -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    return context.getLocalProperty(EXECUTION_ID_PROPERTY)


def is_planned_execution(directory: str, token: str, execution_id: str | None) -> bool:
    """True for tasks of the first execution that ran a task of plan ``token``."""
    if execution_id is None:
        return False                      # unknown: read as if nothing was pushed
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, token)
    temp = os.path.join(directory, f".{token}.{uuid.uuid4().hex}")
    with open(temp, "w") as handle:
        handle.write(execution_id)
    try:
        os.link(temp, marker)             # atomic: exactly one task creates the marker
    except FileExistsError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    with open(marker) as handle:
        return handle.read() == execution_id
