"""Product search: BM25 over the texts WebShop indexes, in place of its Pyserini/Lucene index.

WebShop searches a Lucene index (Pyserini ``LuceneSearcher``, BM25 with k1=0.9, b=0.4, Lucene's
English analyzer) of each product's title, description, first bullet point and options, and
shows the top 50 hits. Pyserini needs Java and an index built offline; here the same texts are
ranked with **bm25s** (PyPI, ``method="lucene"``: Lucene's BM25 formula, same k1 and b) after an
analyzer written to behave like Lucene's English one: words split as Unicode word boundaries do
(``6.76``, ``l'eau`` stay one token; ``x-large`` is two), possessive ``'s`` dropped, Lucene's 33
English stop words removed, Porter stemming (PyStemmer's ``porter``, the algorithm of Lucene's
``PorterStemFilter``). Only documents that contain a query term are hits; ties keep catalogue
order. Differences left: Lucene stores document lengths lossily (one byte), so scores and the
order of near ties can differ from WebShop's index.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import bm25s
import numpy as np
import Stemmer

SEARCH_RETURN_N = 50
"""Hits WebShop keeps per search (five pages of ten)."""
LUCENE_K1 = 0.9
LUCENE_B = 0.4
LUCENE_ENGLISH_STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_TOKEN = re.compile(r"\w+(?:[.'’]\w+|(?<=\d),\d+)*")
_POSSESSIVE = re.compile(r"['’]s$")


class ProductSearch:
    """BM25 search over ``documents`` (one text per product, in catalogue order)."""

    def __init__(self, documents: Sequence[str]) -> None:
        self._stemmer = Stemmer.Stemmer("porter")
        self._bm25 = bm25s.BM25(method="lucene", k1=LUCENE_K1, b=LUCENE_B)
        self._bm25.index([self.analyze(text) for text in documents], show_progress=False)
        self.size = len(documents)

    def analyze(self, text: str) -> list[str]:
        """Lower-case, tokenize, drop possessives and stop words, Porter-stem."""
        words = [_POSSESSIVE.sub("", w) for w in _TOKEN.findall(text.lower())]
        return self._stemmer.stemWords([w for w in words if w and w not in LUCENE_ENGLISH_STOP_WORDS])

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Positions of the top ``k`` documents for ``query``, best first (only those that match)."""
        terms = [t for t in self.analyze(query) if t in self._bm25.vocab_dict]
        if not terms:
            return []
        scores = np.asarray(self._bm25.get_scores(terms), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")[:k]
        return [int(i) for i in order if scores[i] > 0.0]


class Searcher(Protocol):
    """What the shop needs of a search engine: catalogue positions, best first."""

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]: ...


class LuceneProductSearch:
    """WebShop's own search: Pyserini's ``LuceneSearcher`` over WebShop's Lucene index of the same
    catalogue (``search_engine/indexes``, built by WebShop's ``convert_product_file_format.py`` and
    ``run_indexing.sh``), as ``get_top_n_product_from_keywords`` uses it: the top ``k`` hits, each
    document's ``id`` (the ASIN) looked up in the catalogue (ASINs it lacks are dropped).

    Needs ``pyserini`` (and Java 11+), which this project does not install.
    """

    def __init__(self, index_dir: str | Path, asins: Sequence[str]) -> None:
        index = Path(index_dir).expanduser()
        if not index.is_dir():
            raise ValueError(
                f"search='lucene': the Lucene index {str(index)!r} is not a folder; build it with WebShop's "
                "search_engine/convert_product_file_format.py and run_indexing.sh on the same items_shuffle.json"
            )
        try:
            from pyserini.search.lucene import LuceneSearcher
        except ImportError as exc:
            raise ValueError(
                f"search='lucene' needs pyserini and Java 11+ (pip install pyserini; {exc}); "
                "or use search='bm25', whose results are labelled as not webshop-std"
            ) from None
        self._searcher: Any = LuceneSearcher(str(index))
        self._positions = {asin: i for i, asin in enumerate(asins)}
        self.size = len(asins)

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        """Positions of the top ``k`` hits for ``query`` that are in the catalogue, best first."""
        found = []
        for hit in self._searcher.search(query, k=k):
            asin = json.loads(self._searcher.doc(hit.docid).raw())["id"]
            if asin in self._positions:
                found.append(self._positions[asin])
        return found
