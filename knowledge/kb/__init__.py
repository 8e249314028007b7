"""Knowledge base: torch_npu docs, Ascend docs, op-matrix facts, our recipes and port memory in Chroma.

Importing this package is cheap: chromadb, sentence-transformers and torch load on first use.
"""

from knowledge.errors import KBDependencyError, KBError, KBStoreError
from knowledge.kb.aclnn import DtypeSupport
from knowledge.kb.dtypes import supported_dtypes
from knowledge.kb.kb import KnowledgeBase
from knowledge.kb.models import (
    COLLECTIONS,
    BuildStats,
    Hit,
    SkippedFile,
)
from knowledge.kb.recipes import Recipe, get_recipe, load_recipes

__all__ = [
    "COLLECTIONS",
    "BuildStats",
    "DtypeSupport",
    "Hit",
    "KBDependencyError",
    "KBError",
    "KBStoreError",
    "KnowledgeBase",
    "Recipe",
    "SkippedFile",
    "get_recipe",
    "load_recipes",
    "supported_dtypes",
]
