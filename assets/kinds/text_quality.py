"""Great Expectations on a text corpus as it is ingested: a per-document table (id, characters,
label) validated chunk by chunk, a one-row corpus table and a per-class table at the end.

The plain checks of the files (encoding, JSON, fields) name the file and line of each problem
(assets/kinds/text_read.py); the length and label rules are checked both ways: as expectations,
whose verdicts the report keeps with the tables', and per document, to name the offending line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

import pandas as pd

from assets.kinds.text_read import Document
from assets.quality.runner import ExpectationOutcome, SuiteRunner
from core.spec import PipelineSpec


def class_names_of(spec: PipelineSpec) -> tuple[str, ...]:
    return spec.class_names if spec.task == "classification" else ()


def document_problem(spec: PipelineSpec, document: Document) -> str | None:
    """Why ``document`` cannot be kept (length, label), naming its file and line; None when it can."""
    source, classes = spec.source, class_names_of(spec)
    where = _where(document)
    n = len(document.text)
    if n < source.min_chars:
        return f"{where}: {n:,} characters, fewer than min_chars={source.min_chars:,}"
    if n > source.max_chars:
        return f"{where}: {n:,} characters, more than max_chars={source.max_chars:,}"
    if classes and document.label is None:
        if document.id == document.file:
            return (f"{where}: a .txt file has no label; text classification reads labels from the JSONL field "
                    f"{source.label_field!r}")
        return f"{where}: no label in field {source.label_field!r}"
    if classes and document.label not in classes:
        return f"{where}: label {document.label!r} is not one of the declared classes {list(classes)}"
    return None


def _where(document: Document) -> str:
    if document.id == document.file:
        return document.file
    return f"{document.file} line {document.id.rpartition(':')[2]}"


class DocumentExpectations:
    """Feed it every parsed document, a chunk at a time (``add``); ``finish`` gives the outcomes."""

    def __init__(self, spec: PipelineSpec):
        import great_expectations as gx

        E = gx.expectations
        self.classes = class_names_of(spec)
        self.runner = SuiteRunner(f"{spec.name}/raw_dataset")
        self.per_document = [E.ExpectColumnValuesToBeBetween(column="chars", min_value=spec.source.min_chars,
                                                             max_value=spec.source.max_chars)]
        if self.classes:
            self.per_document += [E.ExpectColumnValuesToNotBeNull(column="label"),
                                  E.ExpectColumnValuesToBeInSet(column="label", value_set=list(self.classes))]
        self.corpus = [E.ExpectColumnValuesToBeBetween(column="documents", min_value=1)]
        self.per_class = [E.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=list(self.classes))]
        self._merged: list[ExpectationOutcome] | None = None
        self.documents = 0
        self.labels: Counter[str] = Counter()

    def add(self, documents: list[Document]) -> None:
        if not documents:
            return
        frame = pd.DataFrame({"id": [d.id for d in documents], "chars": [len(d.text) for d in documents],
                              "label": pd.Series([d.label for d in documents], dtype=object)})
        self._merge([outcome for outcome, _ in self.runner.validate("documents", self.per_document, frame)])
        self.documents += len(documents)
        self.labels.update(d.label for d in documents if d.label is not None)

    def state(self) -> dict:
        """What ``resume`` needs to go on as if every document fed so far were fed again: the
        merged per-document outcomes, the documents and the labels counted (JSON, for the ingest
        record a later version's ingest of new documents resumes from, text_append.py)."""
        return {"documents": self.documents, "labels": dict(sorted(self.labels.items())),
                "merged": None if self._merged is None else [asdict(o) for o in self._merged]}

    def resume(self, state: dict) -> None:
        """Go on from ``state`` (``state()`` of expectations fed the same documents in the same chunks)."""
        self.documents = state["documents"]
        self.labels = Counter(state["labels"])
        self._merged = None if state["merged"] is None else [ExpectationOutcome(**o) for o in state["merged"]]

    def _merge(self, outcomes: list[ExpectationOutcome]) -> None:
        """Map expectations without ``mostly``: the corpus passes when every chunk passes."""
        if self._merged is None:
            self._merged = outcomes
            return
        for total, chunk in zip(self._merged, outcomes):
            total.success = total.success and chunk.success
            total.error = total.error or chunk.error
            if chunk.unexpected_count:
                total.unexpected_count = (total.unexpected_count or 0) + chunk.unexpected_count
                total.examples = (total.examples + chunk.examples)[:5]

    def finish(self, files: int) -> list[ExpectationOutcome]:
        if self._merged is None:  # no document at all: the expectations still say what they saw
            empty = pd.DataFrame({"id": pd.Series(dtype=str), "chars": pd.Series(dtype="int64"),
                                  "label": pd.Series(dtype=object)})
            self._merged = [o for o, _ in self.runner.validate("documents", self.per_document, empty)]
        outcomes = list(self._merged)
        corpus = pd.DataFrame({"files": [files], "documents": [self.documents]})
        outcomes += [o for o, _ in self.runner.validate("corpus", self.corpus, corpus)]
        if self.classes:
            outcomes += [o for o, _ in self.runner.validate("classes", self.per_class, self.class_table())]
            outcomes.append(self.class_shares())
        return outcomes

    def class_table(self) -> pd.DataFrame:
        """One row per label found, with its documents and its share of all labelled documents."""
        total = sum(self.labels.values())
        labels = sorted(self.labels)
        return pd.DataFrame({"label": pd.Series(labels, dtype=str),
                             "documents": [self.labels[c] for c in labels],
                             "share": [self.labels[c] / total for c in labels]})

    def class_shares(self) -> ExpectationOutcome:
        """Not a rule: the share of each declared class, reported beside the checks."""
        total = sum(self.labels.values())
        shares = {c: round(self.labels[c] / total, 6) if total else 0.0 for c in self.classes}
        return ExpectationOutcome(table="classes", expectation="report_class_shares",
                                  kwargs={"class_names": list(self.classes)}, success=True, observed=shares)
