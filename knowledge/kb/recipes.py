"""Our porting recipes (knowledge/recipes/H*.md): one per hazard class of DESIGN §7.

Each file is Markdown with YAML front matter (id, title, category, signals, keys) and the sections
Symptom, Fix, Verify, When not to apply. Readable without Chroma: the offline rule policy cites
them by id ("recipe:H1").
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, Field

from knowledge.errors import KBError
from knowledge.kb.chunking import digest
from knowledge.kb.models import Chunk

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
SECTIONS = {"symptom": "Symptom", "fix": "Fix", "verify": "Verify", "when_not": "When not to apply"}


class Recipe(BaseModel):
    hazard: str  # "H1"
    title: str
    category: str = ""
    signals: list[str] = Field(default_factory=list)  # regexes (case-insensitive) over queries/errors
    keys: list[str] = Field(default_factory=list)  # identifier keys this recipe is about
    symptom: str
    fix: str
    verify: str
    when_not: str
    path: str = ""

    @property
    def id(self) -> str:
        return f"recipe:{self.hazard}"

    def text(self) -> str:
        parts = [f"{self.id} {self.title}"]
        for field, heading in SECTIONS.items():
            parts.append(f"## {heading}\n{getattr(self, field)}")
        return "\n\n".join(parts)

    def matches(self, text: str) -> bool:
        return any(re.search(rx, text, re.I) for rx in self.signals)


def parse_recipe(text: str, path: str = "") -> Recipe:
    m = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
    if not m:
        raise KBError(f"{path}: a recipe needs YAML front matter between '---' lines")
    front = yaml.safe_load(m.group(1)) or {}
    sections: dict[str, str] = {}
    for sm in re.finditer(r"^## (.+?)\n(.*?)(?=^## |\Z)", m.group(2), re.S | re.M):
        sections[sm.group(1).strip().lower()] = sm.group(2).strip()
    values = {field: sections.get(heading.lower(), "") for field, heading in SECTIONS.items()}
    missing = [SECTIONS[f] for f, v in values.items() if not v]
    if missing:
        raise KBError(f"{path}: recipe {front.get('id')} lacks sections {missing}")
    for rx in front.get("signals") or []:
        re.compile(rx)  # a bad pattern should fail loading, not searching
    return Recipe(
        hazard=str(front["id"]),
        title=str(front["title"]),
        category=str(front.get("category", "")),
        signals=list(front.get("signals") or []),
        keys=list(front.get("keys") or []),
        path=path,
        **values,
    )


@lru_cache(maxsize=1)
def load_recipes() -> tuple[Recipe, ...]:
    recipes = [parse_recipe(p.read_text(encoding="utf-8"), str(p)) for p in RECIPES_DIR.glob("H*.md")]
    return tuple(sorted(recipes, key=lambda r: int(r.hazard[1:])))


def get_recipe(hazard: str) -> Recipe:
    """`get_recipe("H7")` or `get_recipe("recipe:H7")`."""
    hz = hazard.removeprefix("recipe:").upper()
    for r in load_recipes():
        if r.hazard == hz:
            return r
    raise KeyError(hazard)


def recipe_keys_for(query: str) -> list[str]:
    """Hazard keys ("hz:h7") of the recipes whose signals match the query text."""
    return [f"hz:{r.hazard.lower()}" for r in load_recipes() if r.matches(query)]


def recipe_chunks(recipe: Recipe) -> list[Chunk]:
    """One chunk per section, so each can be found on its own; hits are merged per recipe later."""
    chunks: list[Chunk] = []
    keys = [f"hz:{recipe.hazard.lower()}", *recipe.keys]
    for i, (field, heading) in enumerate(SECTIONS.items()):
        body = getattr(recipe, field)
        title = f"{recipe.hazard} {recipe.title} > {heading}"
        chunks.append(
            Chunk(
                id=f"recipe-{recipe.hazard}-{digest(field)[:6]}-{i}",
                collection="recipes",
                title=title,
                text=body,
                embed_text=f"{recipe.title}. {heading}: {body}",
                source=recipe.id,
                path=recipe.path,
                anchor=field.replace("_", "-"),
                keys=keys,
                primary=keys[:1],
                language="en",
                kind="recipe",
            )
        )
    return chunks


def recipe_load(recipe: Recipe) -> tuple[list[Chunk], str]:
    """A recipe as a source unit's chunks (the knowledge base's loader signature)."""
    return recipe_chunks(recipe), ""
