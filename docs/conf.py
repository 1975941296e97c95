"""Sphinx configuration of the celery-leaderbeat documentation (MyST Markdown, furo).

Build (warnings are errors, broken internal links and references included)::

    docs/build            # python -m sphinx -W --keep-going -n -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))          # the package of this checkout, not an installed one
sys.path.insert(0, str(DOCS / "_ext"))  # leaderbeat_settings: the settings table

from celery_leaderbeat._version import __version__

project = "celery-leaderbeat"
author = "The celery-leaderbeat authors"
copyright = "The celery-leaderbeat authors"
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "leaderbeat_settings",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "build", "Thumbs.db", ".DS_Store"]

# Links between pages are checked: a link to a page or heading that does not exist is a
# warning (an error under -W), and so is a reference nitpicky mode cannot resolve.
myst_all_links_external = False
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]
suppress_warnings: list[str] = []
nitpicky = True
# Type hints that name other libraries' classes (redis-py, Celery, click) have no
# inventory offline; the ones of this package and the standard library resolve or are
# listed here by name.
nitpick_ignore_regex = [
    ("py:class", r"(celery|kombu|redis|click|datetime|collections|typing|_io)\..*"),
    ("py:class", (r"(Any|Mapping|Callable|Iterable|Iterator|Sequence|Path|timedelta|datetime|"
                 r"tzinfo|Celery|Request|Cluster|Config|Entry|Schedule|Store|ConfigurationError|"
                 r"EntryExists|EntryUnknown|EntryNotFound)")),
    ("py:mod", r"celery_leaderbeat\..*"),
    # internal classes that appear in public signatures and are not part of the API
    ("py:class", (r"celery_leaderbeat\.(config\.Config|store\.records\.Stored|"
                 r"entries\.EntryOptions|roles\.requests\.Request|"
                 # the rows Cluster returns (typed dicts), described in api.md
                 r"ops\.cluster\.(Leader|EntryRow|NodeRow|HistoryEvent))")),
]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = f"celery-leaderbeat {release}"
html_static_path: list[str] = []
