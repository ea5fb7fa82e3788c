"""MkDocs hook (mkdocs.yml `hooks:`): the site's home page is README.md itself, its links made relative to
docs/, so the README and the home page never say two things."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent / "README.md"


def readme_as_home(readme: str) -> str:
    text = readme.replace("](docs/", "](")
    # the README's pointer to the pages, said from inside them
    return re.sub(r"The pages under \[`docs/`\]\(\) are Markdown;", "These pages are the Markdown files under `docs/`;", text)


def on_page_markdown(markdown: str, page: Any, **_kwargs: Any) -> str:
    if page.file.src_uri == "index.md":
        return readme_as_home(README.read_text(encoding="utf-8"))
    return markdown
