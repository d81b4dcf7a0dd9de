"""Data: corpora verified before use (:mod:`~harness.data.corpora`, torch-free), fetching
(:mod:`~harness.data.fetch`), seeded batches and exact bits per byte (:mod:`~harness.data.batches`,
imported from there since it needs torch)."""

from harness.data.corpora import (
    WIKITEXT2_PINS,
    Corpus,
    CorpusSpec,
    LocalCorpus,
    PinnedFile,
    corpus_name,
    default_data_dir,
    load_corpus,
    read_verified,
    sha256_file,
    verify_wikitext2,
)
from harness.data.fetch import MAX_MEMBER_BYTES, WIKITEXT2_MIRRORS, fetch_wikitext2, load_pins
from harness.names import SPLITS

__all__ = [
    "MAX_MEMBER_BYTES",
    "SPLITS",
    "WIKITEXT2_MIRRORS",
    "WIKITEXT2_PINS",
    "Corpus",
    "CorpusSpec",
    "LocalCorpus",
    "PinnedFile",
    "corpus_name",
    "default_data_dir",
    "fetch_wikitext2",
    "load_corpus",
    "load_pins",
    "read_verified",
    "sha256_file",
    "verify_wikitext2",
]
