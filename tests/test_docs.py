"""The README is a user's page and the documentation site is whole.

The README is also the package's long description on PyPI, where a relative link
is broken: every link in it is absolute. The glossary in docs/concepts.md defines
every term the README uses, and the README links each one to it. The settings
reference is generated from celery_leaderbeat/config.py by docs/_ext; its
descriptions must name exactly the settings the code has. Building the site
(docs/build, warnings as errors) needs the docs extra and is skipped without it.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GLOSSARY = (ROOT / "docs" / "concepts.md").read_text()
DOCS_URL = "https://github.com/celery-leaderbeat/celery-leaderbeat/blob/main/docs/"

#: the terms the glossary must define; a README that uses one links it there
TERMS = ("leader", "standby", "slot", "lease", "epoch", "rescue", "catch-up", "anchor",
         "phase", "chunk", "margin", "generation", "floor", "claim")

#: [text](target) and reference-style "[name]: target" links
LINK = re.compile(r"\]\(([^)\s]+)\)|^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def links(text: str) -> list[str]:
    return [a or b for a, b in LINK.findall(text)]


def glossary_terms() -> set[str]:
    section = GLOSSARY[GLOSSARY.index("\n## Glossary"):]
    return {m.strip() for m in re.findall(r"^### (.+)$", section, re.MULTILINE)}


def test_the_readme_is_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_the_readme_names_the_demo_command_and_the_test_command_ci_runs():
    header = (ROOT / ".ci" / "run").read_text().split("set -euo pipefail")[0]
    test_command = re.search(r"Test command.*\n#\s+(python -m pytest[^\n]*)", header).group(1)
    assert test_command.strip() in README
    assert "pip install -e '.[demo]' && python -m celery_leaderbeat.demo" in README


def test_the_readme_has_no_relative_link():
    relative = [target for target in links(README)
                if not target.startswith(("https://", "http://", "#"))]
    assert relative == []


def test_the_readmes_in_page_links_name_its_own_headings():
    anchors = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", README, re.MULTILINE)}
    assert [t for t in links(README) if t.startswith("#") and t[1:] not in anchors] == []


def test_every_glossary_term_is_defined_and_every_term_the_readme_uses_links_to_it():
    assert [t for t in TERMS if t not in glossary_terms()] == []
    used = [t for t in TERMS if re.search(rf"\b{re.escape(t)}", README, re.IGNORECASE)]
    assert used, "the README uses none of the glossary's terms"
    linked = {t.split("#", 1)[1] for t in links(README) if t.startswith(DOCS_URL + "concepts.md#")}
    assert [t for t in used if t not in linked] == []
    assert linked <= glossary_terms(), linked - glossary_terms()


def test_the_readmes_links_into_docs_name_pages_that_exist():
    pages = {t[len(DOCS_URL):].split("#")[0] for t in links(README) if t.startswith(DOCS_URL)}
    assert pages, "the README links no page of the documentation"
    assert [p for p in sorted(pages) if not (ROOT / "docs" / p).is_file()] == []


def settings_extension():
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import leaderbeat_settings
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    return leaderbeat_settings


def test_the_settings_reference_describes_exactly_the_settings_the_code_has():
    from celery_leaderbeat.config import DEFAULTS

    ext = settings_extension()
    assert ext.drift() == []
    table = "\n".join(ext.settings_table())
    assert [n for n in DEFAULTS if f"`leaderbeat_{n}`" not in table] == []


def test_the_settings_reference_states_the_rule_the_code_enforces():
    ext = settings_extension()
    assert ext.rules("lease_ttl") == ["must be a number of seconds", "must be at least 1.0"]
    assert ext.rules("catchup") == ["must be one of latest, skip, all"]


DOCS_TOOLS = ("sphinx", "myst_parser", "furo", "sphinx_click")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in DOCS_TOOLS),
                    reason="needs the docs extra: pip install -e '.[docs]'")
def test_the_documentation_builds_with_warnings_as_errors(tmp_path):
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q",
                           "-b", "html", "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"),
                           str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "html" / "reference" / "settings.html").is_file()
