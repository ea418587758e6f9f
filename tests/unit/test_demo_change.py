"""The demo's governed change: its manifests pass ``helmhive validate``, and its repository is reproducible."""

from __future__ import annotations

import subprocess
from pathlib import Path

from helmhive.devcluster.demo_git import DEMO_FILES, ensure_demo_repository
from helmhive.devcluster.demo_manifests import DEMO_CHANGE, build_change_documents, build_demo_documents
from helmhive.policy.validation.manifests import SourceDocument, validate_documents


def test_the_demo_documents_are_valid_together(tmp_path: Path) -> None:
    _, commit = ensure_demo_repository(tmp_path)
    docs = [*build_demo_documents(), *build_change_documents(repository="git://127.0.0.1:9418/shop.git", commit=commit)]
    report = validate_documents(
        documents=[
            SourceDocument(file="demo.yaml", index=i, body=d) for i, d in enumerate(docs) if d["kind"] != "Secret"
        ],
        external_profiles=(),
    )
    assert [str(i) for i in report.issues] == []
    change = next(d for d in docs if d["kind"] == "Change")
    assert change["metadata"]["name"] == DEMO_CHANGE and change["spec"]["source"]["commit"] == commit


def test_the_demo_repository_has_the_same_commit_on_every_machine(tmp_path: Path) -> None:
    first, commit = ensure_demo_repository(tmp_path / "a")
    _, again = ensure_demo_repository(tmp_path / "b")
    assert commit == again and len(commit) == 40
    assert ensure_demo_repository(tmp_path / "a") == (first, commit)  # reused, not rebuilt
    listed = subprocess.run(
        ["git", "--git-dir", str(first), "ls-tree", "--name-only", commit], capture_output=True, text=True, check=True
    ).stdout.split()
    assert sorted(listed) == sorted(DEMO_FILES)
