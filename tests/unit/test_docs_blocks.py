"""The docs test's extractor (tests/docs_blocks.py) and the examples it finds.

Proves: the rules work on a sample (runnable languages only, skip markers with their
reason, ``# →`` expectations, an output block, ports replaced and nothing else); and on
the real README.md and docs/*.md, the number of examples marked as not runnable is
exactly the number listed here, with a reason each, so an example cannot leave the
docs test without this file changing too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs_blocks import MarkdownError, blocks_of, documents, find_in_order, with_ports

ROOT = Path(__file__).resolve().parents[2]

# Examples that cannot run in a test, per file (each marked in the file with its reason).
SKIPPED_BY_MARKER = {"README.md": 7, "docs/client.md": 1, "docs/spark.md": 2}
# Examples that run, per file.
RUNNING = {"README.md": 5, "docs/archive.md": 1, "docs/client.md": 7, "docs/spark.md": 1}

SAMPLE = '''# Title

```sh
echo one
#  → one
```

<!-- docs-test: skip: needs a cluster -->
```sh
kubectl apply -k .
```

```
a diagram
```

```python
print("sent", 1)
```

<!-- docs-test: output -->
```text
sent 1
```

```yaml
key: value
```
'''


def test_the_rules_on_a_sample(tmp_path):
    path = tmp_path / "sample.md"
    path.write_text(SAMPLE)
    blocks = blocks_of(path, tmp_path)
    assert [(b.kind, b.line, b.skip_reason) for b in blocks] == [
        ("sh", 3, None), ("sh", 9, "needs a cluster"), ("python", 17, None)]
    assert blocks[0].expectations == ["one"]
    assert blocks[2].expectations == ["sent 1"]
    assert blocks[0].code == "echo one\n#  → one\n"


@pytest.mark.parametrize("text", [
    "<!-- docs-test: skip -->\n```sh\nx\n```\n",                 # no reason
    "<!-- docs-test: skip: why -->\n```text\nx\n```\n",         # not an example
    "<!-- docs-test: output -->\n```text\nx\n```\n",            # output of nothing
    "```sh\nnever closed\n",
])
def test_misused_markers_fail_loudly(tmp_path, text):
    path = tmp_path / "bad.md"
    path.write_text(text)
    with pytest.raises(MarkdownError):
        blocks_of(path, tmp_path)


def test_expectations_match_in_order_with_gaps():
    output = 'a {"messages": [{"message_id": "1:0", "payload": "hi"}]} then "status": "duplicate"'
    assert find_in_order(output, ['{"messages": [{"message_id": "...", "payload": "', '"status": "duplicate"']) is None
    assert find_in_order(output, ['"status": "duplicate"', '{"messages"']) == '{"messages"'
    assert find_in_order(output, ["missing"]) == "missing"


def test_ports_are_the_only_thing_replaced():
    code = "curl http://127.0.0.1:8081/v1 && magnetar --metadata etcd://127.0.0.1:2379 x --port 6650"
    assert with_ports(code, {8081: 40001, 2379: 40002, 6650: 40003}) == (
        "curl http://127.0.0.1:40001/v1 && magnetar --metadata etcd://127.0.0.1:40002 x --port 6650")
    assert with_ports(code, {}) == code


def test_every_example_of_the_docs_runs_or_says_why_not():
    skipped: dict[str, int] = {}
    running: dict[str, int] = {}
    for path in documents(ROOT):
        for block in blocks_of(path, ROOT):
            if block.skip_reason is None:
                running[block.path] = running.get(block.path, 0) + 1
            else:
                assert len(block.skip_reason) > 10, block.name
                skipped[block.path] = skipped.get(block.path, 0) + 1
    assert skipped == SKIPPED_BY_MARKER
    assert running == RUNNING
