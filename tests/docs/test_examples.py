"""Every fenced block of README.md and of the docs site is an example that runs, or is checked, as
its marker says (docs/index.md, "How these pages are tested").

Sybil finds the blocks. The examples are parametrised here, rather than collected by Sybil's pytest
plugin, because that plugin only sees files under the paths pytest collects (``tests/``) and the
pages live at the top of the repository. A page's examples share one namespace and run in page order.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples import REPO, PageContext, pages, sybil
from tests.docs.homes import PageHomes

DOCUMENTS = [sybil().parse(page) for page in pages()]
EXAMPLES = [example for document in DOCUMENTS for example in document.examples()]


def example_id(example) -> str:
    return f"{Path(example.path).relative_to(REPO)}:{example.line}"


@pytest.fixture(scope="module")
def page_context(tmp_path_factory) -> PageContext:
    def prepared() -> Path:
        from tests.cli.demo_platform import pristine_demo_home

        return pristine_demo_home(tmp_path_factory)

    root = tmp_path_factory.mktemp("docs")
    return PageContext(homes=PageHomes(prepared, root / "homes"), data_root=root / "platform")


def test_every_page_has_examples():
    """A lexer that stopped finding fenced blocks would pass every page silently."""
    empty = [str(Path(d.path).relative_to(REPO)) for d in DOCUMENTS
             if "```" in Path(d.path).read_text() and not list(d.examples())]
    assert not empty, f"pages whose fenced blocks were not found: {empty}"


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_example(example, page_context):
    example.namespace["_page"] = page_context
    example.evaluate()
