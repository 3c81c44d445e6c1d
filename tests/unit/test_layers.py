"""The package layers (docs/architecture.md, "Layers"; contracts in .importlinter).

What it proves: ``lint-imports`` passes on this tree, and each contract can fail — a
copy of the packages with one deliberately broken import (an upward import, the gateway
reaching a bookie, Spark reaching broker internals, a cycle between two modules of a
package, an upward import hidden under TYPE_CHECKING) makes ``lint-imports`` exit
non-zero naming the broken contract. How: the real command on the real sources, and on
a copy in a temporary directory (the copy is what Python imports there, since the
current directory comes first on the path).
"""

from __future__ import annotations

import ast
import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
TIMEOUT_S = 120


def root_packages() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    return config["importlinter"]["root_packages"].split()


def lint(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=directory, capture_output=True, text=True,
                          timeout=TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(directory)})


def test_the_tree_keeps_every_contract():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# What the vocabulary may import besides the standard library: the entry digest.
VOCABULARY_THIRD_PARTY = {"crc32c"}


def test_the_vocabulary_imports_only_the_standard_library_and_crc32c():
    """The contract forbids the third-party packages the servers depend on by name; this
    closes the gap it leaves (a package added later): every import in common/ is of the
    standard library, of common itself, or crc32c. How: the import statements of each
    module, read with ast (nothing is imported)."""
    imported: dict[str, set[str]] = {}
    for path in sorted((ROOT / "common").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                imported.setdefault(name.partition(".")[0], set()).add(path.name)
    assert imported.get("crc32c") == {"entry.py"}, "the scan missed the entry digest's import"
    outside = {top: files for top, files in imported.items()
               if top not in sys.stdlib_module_names and top != "common" and top not in VOCABULARY_THIRD_PARTY}
    assert not outside, outside


def test_every_layer_package_exists():
    """A contract over a package that is not there would check nothing."""
    for package in root_packages():
        assert (ROOT / package / "__init__.py").is_file(), package


@pytest.fixture
def copy_of_tree(tmp_path: Path) -> Path:
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    for package in root_packages():
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_copy_keeps_every_contract_until_broken(copy_of_tree: Path):
    """The copy is checked, not the installed tree: unbroken, it passes as the tree does."""
    result = lint(copy_of_tree)
    assert result.returncode == 0, result.stdout + result.stderr


BROKEN_IMPORTS = [
    # (file to write, its source, the contract that must break)
    ("common/upward.py", "import broker.service\n", "Packages import downwards only"),
    ("common/runtime_in_vocabulary.py", "import runtime.tasks\n", "Packages import downwards only"),
    ("common/third_party.py", "import aiohttp\n", "The vocabulary (common) imports nothing of ours"),
    ("runtime/sibling.py", "import protocol.codec\n", "Packages import downwards only"),
    ("metadata/upward.py", "from ledger.client import LedgerClient\n", "Packages import downwards only"),
    ("subscriptions/sibling.py", "import bundles.ownership\n", "Packages import downwards only"),
    ("managed_ledger/sibling.py", "import subscriptions.ack_set\n", "Packages import downwards only"),
    ("subscriptions/managed.py", "import managed_ledger.managed_ledger\n", "Packages import downwards only"),
    ("managed_ledger/upward.py", "import broker.topic\n", "Packages import downwards only"),
    ("subscriptions/typing_only.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from broker.consumer import Consumer\n",
     "Packages import downwards only"),
    ("gateway/reach.py", "import bookie.journal\n", "The gateway reaches data only through brokers"),
    ("gateway/sibling.py", "import broker.topic\n", "Packages import downwards only"),
    ("client/sibling.py", "import ledger.client\n", "Packages import downwards only"),
    ("spark/reach.py", "import broker.topic\n", "Spark reaches data through brokers"),
    ("spark/reach_ledgers.py", "import managed_ledger.archive_reads\n", "Spark reaches data through brokers"),
    ("gateway/reach_ledgers.py", "import managed_ledger.managed_ledger\n",
     "The gateway reaches data only through brokers"),
    ("protocol/cycle_a.py", "import protocol.cycle_b\n", "No import cycles"),
]


@pytest.mark.parametrize("path, source, contract", BROKEN_IMPORTS, ids=[b[0] for b in BROKEN_IMPORTS])
def test_a_broken_import_fails_the_check(copy_of_tree: Path, path: str, source: str, contract: str):
    (copy_of_tree / path).write_text(source)
    if path == "protocol/cycle_a.py":
        (copy_of_tree / "protocol/cycle_b.py").write_text("import protocol.cycle_a\n")
    result = lint(copy_of_tree)
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout.replace("\n", " "), result.stdout
    assert "BROKEN" in result.stdout
