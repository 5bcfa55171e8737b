"""Tests for valueprobe.datasets: determinism, the contract, per-family invariants, bad input.

HF_HUB_OFFLINE=1 python -m pytest -q tests/test_datasets.py
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from valueprobe.datasets import build, read_jsonl
from valueprobe.datasets import icrl as icrl_mod
from valueprobe.datasets.build import MANIFEST
from valueprobe.errors import ValueprobeError
from valueprobe.files import sha256_file

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = (
    "icrl",
    "icrl_control",
    "icrl_pairs",
    "code",
    "backtracking",
    "confidence",
    "refusal",
    "sensitive",
    "preference_words",
    "preference_words_eval",
    "preference_safety",
    "steer_confidence",
    "steer_backtracking",
    "steer_code",
    "steer_refusal",
    "steer_open",
    "steer_conditions",
    "neutral_text",
    "task_arithmetic",
    "task_code",
)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two independent default builds (seed 0) in the same interpreter."""
    a, b = tmp_path_factory.mktemp("build_a"), tmp_path_factory.mktemp("build_b")
    build("all", a, seed=0)
    build("all", b, seed=0)
    return a, b


@pytest.fixture(scope="module")
def data() -> dict[str, list]:
    """The committed default build, read through the validator."""
    return {name: read_jsonl(DATA / f"{name}.jsonl") for name in FILES}


# --- determinism -------------------------------------------------------------------------------


def test_same_seed_gives_identical_bytes(builds: tuple[Path, Path]) -> None:
    a, b = builds
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) == sorted([*(f"{n}.jsonl" for n in FILES), MANIFEST])
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_other_seed_differs(tmp_path: Path) -> None:
    build("icrl", tmp_path / "s1", seed=1, n=20)
    build("icrl", tmp_path / "s0", seed=0, n=20)
    assert (tmp_path / "s1" / "icrl.jsonl").read_bytes() != (tmp_path / "s0" / "icrl.jsonl").read_bytes()


@pytest.mark.parametrize("name", [f for f in FILES if f != "code"])
def test_committed_build_regenerates(builds: tuple[Path, Path], name: str) -> None:
    # These families use only random.Random(seed) and curated lists: any interpreter reproduces them.
    assert (builds[0] / f"{name}.jsonl").read_bytes() == (DATA / f"{name}.jsonl").read_bytes()


def test_committed_code_regenerates(builds: tuple[Path, Path]) -> None:
    recorded = json.loads((DATA / MANIFEST).read_text())["files"]["code.jsonl"]["python"]
    here = ".".join(map(str, sys.version_info[:3]))
    if here != recorded:
        pytest.skip(f"data/code.jsonl was mined from the Python {recorded} standard library; this is {here}")
    assert (builds[0] / "code.jsonl").read_bytes() == (DATA / "code.jsonl").read_bytes()


# --- the committed files -----------------------------------------------------------------------


def test_committed_files_validate_and_match_manifest(data: dict[str, list]) -> None:
    manifest = json.loads((DATA / MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(f"{n}.jsonl" for n in FILES)
    total = 0
    for name, rows in data.items():
        entry = manifest["files"][f"{name}.jsonl"]
        assert entry["sha256"] == sha256_file(DATA / f"{name}.jsonl")
        assert entry["rows"] == len(rows)
        assert entry["groups"] == dict(Counter(r.group for r in rows))
        total += (DATA / f"{name}.jsonl").stat().st_size
    assert total + sum(p.stat().st_size for p in DATA.glob("*.md")) <= 5 * 1024 * 1024


def test_counts_meet_minimums(data: dict[str, list]) -> None:
    icrl = data["icrl"]
    assert len(icrl) >= 300 and len(data["icrl_control"]) == len(icrl)
    assert len({r.group for r in icrl}) >= 40
    assert sum(r.kind == "code" for r in icrl_mod.RULES.values()) >= 20
    assert {r.meta["discovery_round"] for r in icrl} == {2, 3, 4, 5, 6}
    code = Counter(r.group for r in data["code"])
    assert all(code[f"code/{g}"] >= 200 for g in ("original", "shuffled", "renamed", "syntax", "logic"))
    assert len(data["backtracking"]) >= 300
    assert {r.label for r in data["backtracking"]} == {0.0, 1.0}
    refusal = Counter(r.group for r in data["refusal"])
    assert refusal["refusal/harmful"] >= 150 and refusal["refusal/benign"] >= 150
    sensitive = Counter(r.group for r in data["sensitive"])
    assert sensitive["sensitive/sensitive"] >= 100 and sensitive["sensitive/neutral"] >= 100
    targets = {r.meta["target"] for r in data["preference_words"]}
    assert len(targets) >= 10 and targets == {r.meta["target"] for r in data["preference_words_eval"]}
    assert len(data["confidence"]) > 0 and len(data["preference_safety"]) > 0


# --- icrl ----------------------------------------------------------------------------------------


def test_icrl_rule_checkers_agree_with_labels(data: dict[str, list]) -> None:
    for ex in [*data["icrl"], *data["icrl_control"]]:
        assert icrl_mod.check_example(ex) == [], ex.id
        assert ex.group == f"icrl/{ex.meta['rule']}"


def test_icrl_control_matches_paragraph_and_never_rewards(data: dict[str, list]) -> None:
    main = {ex.id: ex for ex in data["icrl"]}
    for ctrl in data["icrl_control"]:
        ex = main[ctrl.meta["pair"]]
        assert (ex.label, ctrl.label) == (1, 0)
        assert ctrl.messages[-1] == ex.messages[-1] and ctrl.spans == ex.spans
        assert len(ctrl.messages) == len(ex.messages)
        assert not any(
            m["content"].startswith(("+1", "Score: +1")) for m in ctrl.messages if m["role"] == "user"
        )
        d = ex.meta["discovery_round"]
        assert ex.messages[2 * d]["content"].replace("Score: ", "").startswith("+1")
        different = [i for i, (m, c) in enumerate(zip(ex.messages, ctrl.messages, strict=True)) if m != c]
        assert different == [2 * d - 1, 2 * d]  # only the discovery attempt and its feedback


def test_icrl_pairs_differ_in_one_character_the_rule_rounds_score(data: dict[str, list]) -> None:
    rows = data["icrl_pairs"]
    assert len(rows) == 192 and len({r.meta["rule"] for r in rows}) == 48
    main = {ex.id for ex in data["icrl"]}
    for rewarded, flipped in zip(rows[::2], rows[1::2], strict=True):
        assert rewarded.meta["pair"] == flipped.meta["pair"] and (rewarded.label, flipped.label) == (1, 0)
        assert rewarded.meta["construction"] == "reward-flip" and "+1" in rewarded.meta["construction_note"]
        assert rewarded.spans == flipped.spans and rewarded.group == flipped.group
        assert (
            icrl_mod.check_example(
                rewarded.__class__(**{**rewarded.__dict__, "messages": rewarded.messages[:-1]})
            )
            == []
        )
        k, at = rewarded.meta["flipped_message"], rewarded.meta["flipped_char"]
        a, b = json.dumps(rewarded.messages), json.dumps(flipped.messages)
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
        assert len(diff) == 1 and a[diff[0]] == "+" and b[diff[0]] == "-"
        assert (
            rewarded.messages[k]["content"][at : at + 2]
            == "+1"
            == flipped.messages[k]["content"][at : at + 2].replace("-", "+")
        )
        assert rewarded.messages[-1]["role"] == "user" and rewarded.messages[-1]["content"].endswith(
            "Answer yes or no."
        )
        assert rewarded.meta["behaviour"] == "yes_no" and rewarded.id.removesuffix("-rewarded") not in main


@pytest.mark.slow
def test_icrl_pairs_are_equal_length_under_the_default_tokenizer(data: dict[str, list]) -> None:
    """What patching needs: each pair's rows tokenize to the same length, differing at one position."""
    from transformers import AutoTokenizer

    from valueprobe.model.gguf import alias_dir
    from valueprobe.model.load import cache_dir

    tok = AutoTokenizer.from_pretrained(alias_dir("smollm2-135m", cache_dir()))
    rows = data["icrl_pairs"]
    for rewarded, flipped in zip(rows[::2], rows[1::2], strict=True):
        texts = [
            tok.apply_chat_template(list(r.messages), tokenize=False, add_generation_prompt=True)
            for r in (rewarded, flipped)
        ]
        a, b = (tok(t, add_special_tokens=False)["input_ids"] for t in texts)
        assert len(a) == len(b), rewarded.meta["pair"]
        assert sum(x != y for x, y in zip(a, b, strict=True)) == 1, rewarded.meta["pair"]


def test_icrl_spans_split_the_final_turn(data: dict[str, list]) -> None:
    for ex in data["icrl"]:
        pre, post = ex.spans
        final = ex.messages[-1]["content"]
        assert ex.messages[-1]["role"] == "assistant"
        assert pre.message == post.message == len(ex.messages) - 1
        assert 0 == pre.start < pre.end == post.start < post.end == len(final)
        # post starts at the token, or at the space before it (which a BPE token carries)
        assert final[post.start :].startswith((ex.meta["token"], " " + ex.meta["token"]))
        assert not final[: post.start].endswith(" ")


# --- code ----------------------------------------------------------------------------------------


class _Anonymise(ast.NodeTransformer):
    """Rename every identifier to its order of first appearance, so renamings compare equal."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _n(self, name: str) -> str:
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.Name:
        node.id = self._n(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.arg = self._n(node.arg)
        self.generic_visit(node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.name = self._n(node.name)
        self.generic_visit(node)
        return node


def _anonymous_dump(src: str) -> str:
    return ast.dump(_Anonymise().visit(ast.parse(src)))


def test_code_corruption_invariants(data: dict[str, list]) -> None:
    originals = {r.id: r.text for r in data["code"] if r.group == "code/original"}
    for src in originals.values():
        ast.parse(src)
        assert 5 <= src.count("\n") <= 40
    seen = Counter()
    for r in data["code"]:
        if r.group == "code/original":
            assert r.label == 1
            continue
        assert r.label == 0
        src = originals[r.meta["pair"]]
        kind = r.group.split("/")[1]
        seen[kind] += 1
        assert r.text != src
        if kind == "shuffled":
            assert sorted(r.text.splitlines()) == sorted(src.splitlines())
            assert r.text.splitlines()[0] == src.splitlines()[0]
        elif kind == "syntax":
            with pytest.raises(SyntaxError):
                ast.parse(r.text)
        elif kind == "logic":
            assert ast.dump(ast.parse(r.text)) != ast.dump(ast.parse(src))
        elif kind == "renamed":
            assert ast.dump(ast.parse(r.text)) != ast.dump(ast.parse(src))
            assert _anonymous_dump(r.text) == _anonymous_dump(src), r.id
    assert set(seen.values()) == {len(originals)}


# --- backtracking, confidence, refusal, preference ----------------------------------------------

_STEP = re.compile(r"(\d+) ([×+\-÷]) (\d+) = (\d+)")
_OPS = {"×": lambda a, b: a * b, "+": lambda a, b: a + b, "-": lambda a, b: a - b, "÷": lambda a, b: a // b}


def _wrong_steps(text: str) -> list[str]:
    return [
        m.group(0)
        for m in _STEP.finditer(text)
        if _OPS[m.group(2)](int(m.group(1)), int(m.group(3))) != int(m.group(4))
    ]


def test_backtracking_rollouts(data: dict[str, list]) -> None:
    for r in data["backtracking"]:
        text = r.messages[1]["content"]
        spans = {s.label: s for s in r.spans}
        assert text.rstrip(".").endswith(r.meta["answer"])
        if r.label == 1:
            assert _wrong_steps(text) == [] and "backtrack" not in spans
        else:
            prefix, marker = spans["prefix"], spans["backtrack"]
            assert prefix.end < marker.start
            assert text[marker.start : marker.end] in (
                "Wait, that's not right.",
                "Hmm, wait. That's not right.",
                "Wait, I made a mistake there.",
                "Hold on, that's not right.",
                "Wait, let me check that again. That's wrong.",
            )
            wrong = _wrong_steps(text[: prefix.end])
            assert wrong and wrong[0] in text[spans["step"].start : spans["step"].end]
            assert _wrong_steps(text[marker.end :]) == []
    pairs = defaultdict(list)
    for r in data["backtracking"]:
        pairs[r.id.rsplit("-", 1)[0]].append(r)
    for twins in pairs.values():
        good, bad = sorted(twins, key=lambda r: -r.label)
        assert good.messages[0] == bad.messages[0]
        count = lambda r: r.messages[1]["content"][: r.spans[0].end].count("\n")  # noqa: E731
        assert count(good) == count(bad)


def test_confidence_labels(data: dict[str, list]) -> None:
    for r in data["confidence"]:
        if r.group.startswith("confidence_verbal/"):
            assert r.label == (r.meta["confidence"] == "high")
            continue
        assert r.messages[-1]["content"] == r.meta["response"] and r.messages[-1]["role"] == "assistant"
        says_correct = (r.meta["response"] == "Yes") == (r.meta["framing"] == "correct")
        assert r.label == says_correct
        assert r.meta["truthful"] == (says_correct == r.meta["answer_correct"])
        assert ("incorrect?" in r.messages[2]["content"]) == (r.meta["framing"] == "incorrect")
        q, a = r.messages[0]["content"], r.messages[1]["content"]
        m = re.fullmatch(r"What is (\d+) ([+\-×]) (\d+)\?", q)
        if m:
            truth = _OPS[m.group(2)](int(m.group(1)), int(m.group(3)))
            assert (a == f"{m.group(1)} {m.group(2)} {m.group(3)} = {truth}.") == r.meta["answer_correct"]


def test_refusal_and_sensitive_pairs_are_matched(data: dict[str, list]) -> None:
    for name, bad, good in (("refusal", "harmful", "benign"), ("sensitive", "sensitive", "neutral")):
        by_pair = defaultdict(dict)
        for r in data[name]:
            by_pair[r.meta["pair"]][r.group.split("/")[1]] = r
        for pair in by_pair.values():
            a, b = pair[bad], pair[good]
            assert (a.label, b.label) == (0, 1)
            assert a.meta["template"] == b.meta["template"]
            la, lb = len(a.messages[0]["content"]), len(b.messages[0]["content"])
            assert abs(la - lb) <= 0.5 * max(la, lb)


def test_preference_rows(data: dict[str, list]) -> None:
    train_prompts = {r.messages[0]["content"] for r in data["preference_words"]}
    for r in data["preference_words"]:
        assert r.meta["chosen"] == r.meta["target"] != r.meta["rejected"]
        assert r.meta["rejected"] in r.meta["options"] and r.meta["target"] in r.messages[0]["content"]
    for r in data["preference_words_eval"]:
        assert r.messages[0]["content"] not in train_prompts
    for r in data["preference_safety"]:
        refuse = r.meta["chosen"] if r.meta["should_refuse"] else r.meta["rejected"]
        assert "can't help" in refuse or "won't help" in refuse


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "n", "needle"),
    [
        ("nope", None, "unknown dataset family"),
        ("icrl", 0, "--n"),
        ("icrl", -3, "--n"),
        ("all", 10_000, "--n 10000"),
        ("preference", 51, "--n 51"),
    ],
)
def test_bad_family_or_n_writes_nothing(tmp_path: Path, family: str, n: int | None, needle: str) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueprobeError, match=re.escape(needle)) as e:
        build(family, out, n=n)
    assert "\n" not in str(e.value)
    assert not out.exists()


def test_unwritable_out_dir_writes_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    for out in (blocker, blocker / "sub"):
        with pytest.raises(ValueprobeError, match="--out") as e:
            build("confidence", out, n=2)
        assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_small_n_builds_every_family(tmp_path: Path) -> None:
    files = build("all", tmp_path, seed=3, n=2)
    assert sorted(files) == sorted(FILES)
    for path in files.values():
        assert read_jsonl(path)
    assert not list(tmp_path.glob("*.tmp"))


# --- steering prompt sets ------------------------------------------------------------------------


def test_steering_sets_end_on_the_user_and_have_60_prompts(data: dict[str, list]) -> None:
    for name in ("steer_backtracking", "steer_code", "steer_open"):
        assert len(data[name]) >= 60, name
    assert sum(r.meta["framing"] == "direct" for r in data["steer_confidence"]) >= 60
    assert sum(r.meta["should_refuse"] for r in data["steer_refusal"]) >= 30
    for name in ("steer_confidence", "steer_backtracking", "steer_code", "steer_refusal", "steer_open"):
        rows = data[name]
        assert all(r.messages[-1]["role"] == "user" for r in rows), name
        prompts = [r.messages[-1]["content"] for r in rows if name != "steer_confidence"]
        assert len(set(prompts)) == len(prompts), f"{name} repeats a prompt"


def test_steering_confidence_pairs_differ_only_in_the_question(data: dict[str, list]) -> None:
    by_pair: dict[str, list] = defaultdict(list)
    for r in data["steer_confidence"]:
        by_pair[r.meta["pair"]].append(r)
    assert {len(v) for v in by_pair.values()} == {2}
    for direct, inverted in by_pair.values():
        assert direct.messages[:2] == inverted.messages[:2]
        assert direct.messages[2]["content"] == "Will this answer be correct? Answer yes or no."
        assert inverted.messages[2]["content"] == "Will this answer be incorrect? Answer yes or no."
    # Half of the partial answers carry a slip, checked by recomputing the shown step.
    assert sum(r.meta["partial_correct"] for r in data["steer_confidence"]) * 2 == len(
        data["steer_confidence"]
    )
    for r in data["steer_confidence"]:
        shown = r.messages[1]["content"]
        m = re.search(r"(\d+) ([+-]) (\d+) = (\d+)\.$", shown)
        if m:
            a, op, b, v = int(m[1]), m[2], int(m[3]), int(m[4])
            assert (v == (a + b if op == "+" else a - b)) == r.meta["partial_correct"], r.id


def test_steering_backtracking_answers_are_computed(data: dict[str, list]) -> None:
    for r in data["steer_backtracking"]:
        assert re.search(r"\d", r.meta["answer"]), r.id
        assert r.messages[0]["content"].endswith("Solve this step by step and give the final answer.")
