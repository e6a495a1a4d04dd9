"""A small DOM of an HTML page (the standard library's html.parser): enough for tests to find an element by id and
read its text, its table rows and its descendants, as a browser's DOM holds them. Hand-written on purpose: no DOM
library (BeautifulSoup, lxml) is in the stack, and adding one to every image and .venv for a test helper of ~60 lines
over the standard library's parser is the worse trade."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element | str] = field(default_factory=list)

    def text(self) -> str:
        """The text of the element and its descendants, white space collapsed."""
        parts = [c if isinstance(c, str) else c.text() for c in self.children]
        return " ".join(" ".join(parts).split())

    def iter(self, tag: str | None = None):
        """This element and its descendants (those of ``tag`` only when given), in document order."""
        if tag is None or self.tag == tag:
            yield self
        for child in self.children:
            if isinstance(child, Element):
                yield from child.iter(tag)

    def by_id(self, element_id: str) -> Element | None:
        return next((e for e in self.iter() if e.attrs.get("id") == element_id), None)

    def rows(self) -> list[list[str]]:
        """The text of each cell (th, td) of each row (tr) under this element."""
        return [[cell.text() for cell in row.iter() if cell.tag in ("th", "td")] for row in self.iter("tr")]


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag):
        for index in range(len(self.stack) - 1, 0, -1):  # close up to the matching open element
            if self.stack[index].tag == tag:
                del self.stack[index:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Element:
    """The document's root element."""
    builder = _Builder()
    builder.feed(html)
    builder.close()
    return builder.root
