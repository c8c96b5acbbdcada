"""The unit of retrieval: one corpus passage with its score, and its prompt formatting.

FlashRAG / Search-R1 corpora store a passage as ``contents = "title\\ntext"``; the first line is
the title and the rest (which may itself hold newlines) is the text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Passage:
    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        """The corpus form ``title\\ntext`` (what Search-R1's server returns as ``contents``)."""
        return f"{self.title}\n{self.text}"

    def to_document(self) -> dict:
        """The Search-R1 / FlashRAG document object ``{"id", "contents"}``."""
        return {"id": self.id, "contents": self.contents}

    @classmethod
    def from_contents(cls, id, contents: str, score: float = 0.0) -> Passage:
        title, text = split_contents(contents)
        return cls(id=str(id), title=title, text=text, score=float(score))


def split_contents(contents: str) -> tuple[str, str]:
    """``"title\\ntext..."`` -> (title, text). A one-line passage has an empty text."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(passages: list[Passage]) -> str:
    """The prompt block of one search result: ``Doc 1(Title: t) text`` lines, best first.

    This is Search-R1's layout; wiki-18 titles keep the double quotes the corpus wraps them in."""
    return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1))
