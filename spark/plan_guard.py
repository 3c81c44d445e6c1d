"""Whether a read task belongs to the query its partitions were planned for.

Why this exists: on pyspark 4.1-4.3 a Python data source's planned read (the pickled
reader and its partitions) is cached on the DataFrame's source object, and a query
with no filters to push does not plan again: an unfiltered ``count()`` after a
filtered one on the same DataFrame runs the *filtered* plan (measured on 4.3.0: 10
rows of 100). A reader that pruned with pushed filters would return the filtered rows.

So a plan made with pushed filters carries a token (its planning time and a random
part), and its partitions keep every file (those the filters prune are marked, not
dropped). The first Spark SQL execution that runs a task of the plan claims the token;
tasks of that execution prune with the filters; tasks of any later execution read
every row the options select. That is right because Spark plans again (a new token)
for every query that has filters to push, so a later execution reusing a token pushed
none.

Where the claim lives: in the metadata store, through any broker's admin REST
(broker/admin/spark_plans.py), which every executor of a cluster reaches as it reaches
the manifest; nothing is kept on an executor's own disk. The pushed filters are also
left for Spark to evaluate again (the reader reports none handled), so pruning is only
ever a saving: a task that cannot be sure it is the plan's first execution (no
execution id, a broker that does not answer, a plan older than ``CLAIM_WINDOW_MS``)
reads every row and is still right. The claim window is shorter than a claim's life
in the store (7 days), so an expired claim is never taken for an unclaimed plan.

Not covered: two queries running at the same time on one DataFrame share pyspark's
cached plan, and the one that did not plan it may claim it first (docs/spark.md, "Not
done yet").
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import OrderedDict

EXECUTION_ID_PROPERTY = "spark.sql.execution.id"
# A plan's first execution must start within this of planning to prune.
CLAIM_WINDOW_MS = 86_400_000
HTTP_TIMEOUT_S = 10.0
# Answers kept per Python worker process: (token, execution id) -> planned.
_CACHE_MAX = 1024
_answers: OrderedDict[tuple[str, str], bool] = OrderedDict()

log = logging.getLogger(__name__)


def new_token(now_ms: int | None = None) -> str:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"{now_ms:013d}-{uuid.uuid4().hex}"


def planned_ms(token: str) -> int:
    return int(token.split("-", 1)[0])


def current_execution_id() -> str | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    return context.getLocalProperty(EXECUTION_ID_PROPERTY)


def is_planned_execution(admin_url: str, topic: str, token: str, execution_id: str | None, *,
                         now_ms: int | None = None) -> bool:
    """True for tasks of the first execution that ran a task of plan ``token``."""
    if execution_id is None:
        return False                      # unknown: read as if nothing was pushed
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if not 0 <= now_ms - planned_ms(token) < CLAIM_WINDOW_MS:
        return False
    key = (token, execution_id)
    if key in _answers:
        return _answers[key]
    claimed = _claim(admin_url, topic, token, execution_id)
    if claimed is None:
        return False                      # not sure: read every row (Spark filters again)
    answer = claimed == execution_id
    _answers[key] = answer
    while len(_answers) > _CACHE_MAX:
        _answers.popitem(last=False)
    return answer


def _claim(admin_url: str, topic: str, token: str, execution_id: str) -> str | None:
    path = topic.split("://", 1)[-1]
    url = f"{admin_url}/admin/v2/persistent/{urllib.parse.quote(path)}/spark-plans/{token}"
    request = urllib.request.Request(url, data=json.dumps({"execution": execution_id}).encode(), method="PUT",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return str(json.loads(response.read())["execution"])
    except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
        log.warning("plan claim failed, reading without pushed filters: url=%s error=%s", url, error)
        return None
