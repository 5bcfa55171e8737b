"""mkdocs hooks for valueprobe's site (mkdocs.yml ``hooks:``): the API pages, the notebooks, and the
repository files the pages link to.

    mkdocs build --strict            # .ci/docs; the site goes to site/

- **API reference.** One page per subpackage (and one for the top-level modules), written at build
  time from the package tree and added to the nav under "API reference": a new or moved module
  appears without editing mkdocs.yml, and a removed one cannot leave a dead page.
- **Repository files.** Pages are plain markdown whose relative links point at real files, so they
  read the same on a code host as on the site. A link that leaves ``docs/`` (``../notebooks/*.ipynb``,
  ``../../probes/*/summary.md``, a source file) is rewritten to a copy of that file placed in the site
  at its repository path; notebooks become pages (mkdocs-jupyter renders them with their saved
  outputs). A link to a file that does not exist is a warning, so ``--strict`` fails on it.

Nothing here reaches the network.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

import valueprobe  # its names resolve lazily (valueprobe/__init__.py): nothing heavy loads here

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "valueprobe"
log = logging.getLogger("mkdocs.hooks.valueprobe")  # under "mkdocs": a warning fails --strict

# [text](target) and ![alt](target): the target up to whitespace or ")", an optional "title"
LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
TOP_MODULES = ("errors", "files", "vocab", "version")


def _subpackages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def _modules(sub: str) -> list[str]:
    """The subpackage's modules, dotted from it, its own subpackages too (steering's ``hook``, ``hook.spec``, ...)."""
    folder = PACKAGE / sub
    nested = [p.parent for p in folder.glob("*/**/__init__.py")]
    modules = [p.with_suffix("") for p in folder.rglob("*.py") if not p.stem.startswith("_")]
    return sorted(".".join(p.relative_to(folder).parts) for p in [*nested, *modules])


# The public API page follows a user's path: load a model, capture, fit, the axis, read, score, steer,
# generate, guide, shift, attribute, audit. Each name of valueprobe.__all__ listed here comes in this
# order (a name not yet public is skipped); the others follow in __all__'s order. A new name: add it here.
USER_PATH = (
    "load", "wrap", "read_jsonl", "Example",
    "capture", "CaptureSettings", "capture_to_store", "ActivationStore",
    "fit_probe", "FitReport", "calibrate",
    "ValueAxis",
    "values", "val", "logit_lens",
    "score_dataset", "ScoreSettings", "ScoreResult",
    "steer", "SteeringSpec", "Steering",
    "generate", "Decoding", "Generation",
    "guide", "Guided",
    "train", "TuneSettings", "TuneResult", "read_pairs", "shift", "ShiftSettings", "ShiftResult",
    "attribution", "AttributeSettings", "Attribution",
    "audit",
)  # fmt: skip


def public_names() -> list[str]:
    """``valueprobe.__all__`` in the order of `USER_PATH`, then the rest as listed."""
    listed = [n for n in USER_PATH if n in valueprobe.__all__]
    return listed + [n for n in valueprobe.__all__ if n not in listed and n != "__version__"]


def _public_page() -> str:
    parts = [
        "# valueprobe\n\nThe public names (`valueprobe.__all__`), in the order a session uses them: load a"
        " model, capture, fit, the axis, read and score, steer and generate, guide, tune and shift,"
        " attribute. Everything else is reached through its module, on the pages that follow.\n\n"
    ]
    for name in public_names():  # as valueprobe exports it: an alias, its primary entry on its module's page
        parts.append(f"::: valueprobe.{name}\n    options:\n      show_root_full_path: false\n\n")
    return "".join(parts)


def _api_pages() -> dict[str, str]:
    """src_uri → markdown for every API page."""
    pages = {
        "api/index.md": _public_page(),
        "api/core.md": "# Ground modules\n\n" + "".join(f"::: valueprobe.{m}\n\n" for m in TOP_MODULES),
    }
    for sub in _subpackages():
        body = "".join(f"::: valueprobe.{sub}.{m}\n\n" for m in _modules(sub))
        pages[f"api/{sub}.md"] = (
            f"# valueprobe.{sub}\n\n::: valueprobe.{sub}\n    options:\n      members: false\n\n{body}"
        )
    return pages


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """The nav's "API reference" section, from the package tree."""
    api = [{"Public API": "api/index.md"}]
    api += [{f"valueprobe.{sub}": f"api/{sub}.md"} for sub in _subpackages()]
    api += [{"Ground modules": "api/core.md"}]
    config.nav = [*(config.nav or []), {"API reference": api}]
    return config


def _outside_links(markdown: str, page_dir: Path) -> list[tuple[str, Path]]:
    """(target as written, the repository file it resolves to) for links that leave docs/."""
    found = []
    for match in LINK.finditer(FENCE.sub("", markdown)):
        target = match.group(2).split("#")[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
            continue
        path = (page_dir / target).resolve()
        if path.is_relative_to(ROOT) and not path.is_relative_to(DOCS):
            found.append((match.group(2), path))
    return found


@event_priority(100)  # before mkdocs-jupyter's on_files, so the notebooks become pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for uri, text in _api_pages().items():
        files.append(File.generated(config, uri, content=text))
    linked = set(ROOT.glob("notebooks/*.ipynb"))
    for page in DOCS.rglob("*.md"):
        linked |= {path for _, path in _outside_links(page.read_text(encoding="utf-8"), page.parent)}
    for path in sorted(p for p in linked if p.is_file()):
        uri = path.relative_to(ROOT).as_posix()
        if files.get_file_from_path(uri) is not None:
            log.warning(f"{uri} is both a docs page and a repository file linked from the docs")
            continue
        files.append(
            File(
                uri, src_dir=str(ROOT), dest_dir=config.site_dir, use_directory_urls=config.use_directory_urls
            )
        )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Links that leave docs/ point at the copies `on_files` placed at their repository paths."""
    if page.file.abs_src_path is None or not Path(page.file.abs_src_path).is_relative_to(DOCS):
        return markdown
    source = Path(page.file.abs_src_path)
    here = posixpath.dirname(page.file.src_uri)
    rewrite: dict[str, str] = {}
    for written, path in _outside_links(markdown, source.parent):
        if not path.is_file():
            what = "a folder: link a file in it" if path.is_dir() else "not a file in the repository"
            log.warning(f"{page.file.src_uri}: the link {written} points at {path.relative_to(ROOT)}, {what}")
            continue
        fragment = written[len(written.split("#")[0]) :]
        rewrite[written] = posixpath.relpath(path.relative_to(ROOT).as_posix(), here or ".") + fragment
    if not rewrite:
        return markdown
    return LINK.sub(lambda m: m.group(1) + rewrite.get(m.group(2), m.group(2)) + m.group(3), markdown)
