"""The documentation says only what is here: the README stays short, every repo-relative link in the
README and the docs resolves, every page is in the site's nav, and the README's set-up commands are
the ones CI runs. ``.ci/docs`` builds the site itself (``mkdocs build --strict``, no network).
"""

from __future__ import annotations

import linecache
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted(
    [README, ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: p.relative_to(ROOT).as_posix(),
)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:")


def links(path: Path) -> list[str]:
    """The relative link targets of a markdown file (code blocks left out, anchors cut off)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    targets = (m.group(1).split("#")[0] for m in LINK.finditer(text))
    return [t for t in targets if t and not SCHEME.match(t)]


def test_the_readme_is_at_most_200_lines():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 200, f"README.md has {n} lines: move detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page):
    found = links(page)
    for target in found:
        assert not target.startswith("/"), f"{page.name}: {target} is absolute; link relative to the page"
        path = (page.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_the_link_check_sees_links_and_fails_on_a_broken_one(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("[a](x.md) ![b](img/y.png#top) [c](https://e.org) [d](#here)\n```\n[e](z.md)\n```\n")
    assert links(page) == ["x.md", "img/y.png"]
    assert not (tmp_path / "x.md").exists()  # so the test above would fail on this page


def _nav_entries(nav) -> list[str]:
    out = []
    for item in nav:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                out += _nav_entries(value) if isinstance(value, list) else [value]
    return out


def test_every_docs_page_and_notebook_is_in_the_nav():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = set(_nav_entries(config["nav"]))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    notebooks = {p.relative_to(ROOT).as_posix() for p in (ROOT / "notebooks").glob("*.ipynb")}
    missing = sorted((pages | notebooks) - nav)
    assert not missing, f"not in mkdocs.yml's nav (one line each): {missing}"
    for entry in nav - pages - notebooks:  # the rest are repository files the docs link to
        assert (ROOT / entry).is_file(), f"mkdocs.yml's nav names {entry}, which does not exist"


def test_the_readme_set_up_commands_are_what_ci_runs():
    readme, ci = README.read_text(encoding="utf-8"), (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    test_command = 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -m "not gpu"'
    assert test_command in readme and test_command in ci
    assert "pip install torch==2.13.0 && pip install -e . && valueprobe demo" in readme
    assert "bash .ci/wheel-check" in ci and "bash .ci/docs" in ci


# How the project is run, not what a user needs: issue numbers, who re-takes a figure, loans of machines.
INTERNAL = re.compile(
    r"\bissues? #?\d+|\bthe issue's\b|\bthe lead\b|\bthis stop\b|\bclosing note|\bbeen lent\b"
    r"|\bin this session\b|\bhelper i\d+",
    re.I,
)


def internal_language(text: str) -> list[str]:
    return [m.group(0) for m in INTERNAL.finditer(text)]


def test_user_facing_text_has_no_internal_language():
    """The README, the docs, the notebooks and the CLI's help speak to users, not to the project."""
    import typer

    from valueprobe.cli.main import app

    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in PAGES}
    texts |= {
        p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
        for p in (ROOT / "notebooks").glob("*.ipynb")
    }
    command = typer.main.get_command(app)
    stack = [command]
    while stack:
        c = stack.pop()
        texts[f"--help of {c.name}"] = " ".join(
            [c.help or "", *(getattr(p, "help", None) or "" for p in c.params)]
        )
        stack += list(getattr(c, "commands", {}).values())
    found = {where: hits for where, text in texts.items() if (hits := internal_language(text))}
    assert found == {}


def test_the_internal_language_check_sees_it():
    assert internal_language("As issue 27 measured, and the lead re-takes it") == ["issue 27", "the lead"]
    assert internal_language("No GPU has been lent to this work yet") == ["been lent"]
    assert internal_language("the issue's sizes") == ["the issue's"]


# ---- every Python snippet on every page runs as written -------------------------------------------

PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
# a page's snippets that need a package outside the test extras: skipped without it
OPTIONAL = {"vllm": "the vllm extra (its own venv: bash .ci/vllm-env)"}


def python_snippets(page: Path) -> list[str]:
    """The page's ```python blocks, in order (they run one after another in one namespace)."""
    return PYTHON.findall(page.read_text(encoding="utf-8"))


SNIPPET_PAGES = [p for p in PAGES if python_snippets(p)]


def test_the_snippet_finder_sees_every_python_block(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("x\n```python\na = 1\n```\n```bash\nls\n```\n```python\nb = a + 1\n```\n")
    assert python_snippets(page) == ["a = 1\n", "b = a + 1\n"]


@pytest.fixture
def docs_folder(tmp_path, monkeypatch):
    """An empty working folder where the repository's probes/ and data/ read as in a checkout."""
    for name in ("probes", "data"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _serve_for(page: Path, code: str, stack):
    """``serving.md``'s client talks to 127.0.0.1:8000: start ``valueprobe serve`` on a free port
    and point the snippet there (the one change made to a snippet before it runs)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    if "127.0.0.1:8000" not in code:
        return code
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "valueprobe", "serve", "--probe", "smollm2-135m-value", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"{page.name}: the server did not start"
            )
            time.sleep(0.5)
    return code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


@pytest.mark.slow
@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in SNIPPET_PAGES])
def test_every_python_snippet_runs(page, docs_folder):
    import contextlib
    import importlib.util

    namespace: dict = {"__name__": "__docs__"}
    with contextlib.ExitStack() as stack:
        for i, code in enumerate(python_snippets(page)):
            missing = [m for m in OPTIONAL if f"from {m} " in code or f"import {m}" in code]
            if missing and importlib.util.find_spec(missing[0]) is None:
                pytest.skip(f"snippet {i + 1} needs {OPTIONAL[missing[0]]}")
            code = _serve_for(page, code, stack)
            name = f"{page.relative_to(ROOT)} (snippet {i + 1})"
            # the source where tracebacks (and nnsight, which reads a `with` block's body back) find it
            linecache.cache[name] = (len(code), None, code.splitlines(keepends=True), name)
            exec(compile(code, name, "exec"), namespace)
