"""Real prompt sets (GSM8K jsonl, verl parquet, other layouts), the held-out split, prompt
rendering, and answer checking on real gold answers and on hostile completions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from scalectl.errors import UserError
from scalectl.rl.data.files import (
    BOXED_INSTRUCTION, load_problems, normalize_answer, read_rows, render_prompt, split_indices, to_record,
)
from scalectl.rl.reward.checker import check, reward
from scalectl.rl.reward.gold import Gold

MATH = Path(__file__).parent / "data" / "math"
GSM8K = MATH / "gsm8k-test.jsonl"


@pytest.fixture(scope="module")
def gsm8k():
    return [to_record(r, i) for i, r in enumerate(read_rows(str(GSM8K)))]


# --------------------------------------------------------------------------- gold answers


def test_every_gsm8k_answer_is_read_and_parses(gsm8k):
    from math_verify import parse

    assert len(gsm8k) == 1319
    assert [r.answers[0] for r in gsm8k[:3]] == ["18", "3", "70000"]
    raw = [json.loads(line)["answer"].rsplit("####", 1)[1].strip() for line in GSM8K.read_text().splitlines()]
    assert sum("," in a for a in raw) == 14                         # thousands separators, removed
    for r, a in zip(gsm8k, raw):
        assert r.answers[0] == a.replace(",", "")
        parsed = parse("\\boxed{" + r.answers[0] + "}", parsing_timeout=None)
        assert parsed and parsed[0] == int(r.answers[0]), r.answers[0]


def test_gsm8k_correct_answers_score_plus_one_wrong_minus_one(gsm8k):
    for r in gsm8k:
        gold = int(r.answers[0])
        assert reward(f"So the total is \\boxed{{{gold}}}.", r.answers[0]) == 1.0
        assert reward(f"\\boxed{{{gold + 1}}}", r.answers[0]) == -1.0
    for r in gsm8k[::10]:                         # the same through math-verify
        gold = int(r.answers[0])
        assert reward(f"\\boxed{{{gold:,}.0}}" if gold >= 1000 else f"\\boxed{{{gold}.0}}", r.answers[0]) == 1.0
        assert reward(f"\\boxed{{\\frac{{{2 * gold + 1}}}{{2}}}}", r.answers[0]) == -1.0


@pytest.mark.parametrize("name,rows", [("aime24", 30), ("aime25", 30), ("amc23", 83)])
def test_aime_and_amc_ground_truths(name, rows):
    records = [to_record(r, i) for i, r in enumerate(read_rows(str(MATH / f"{name}.parquet")))]
    assert len(records) == rows
    for r in records:
        assert reward(f"\\boxed{{{r.answers[0]}}}", r.answers[0]) == 1.0
        value = int(r.answers[0].removesuffix("^\\circ"))
        assert reward(f"\\boxed{{{value}}}", r.answers[0]) == 1.0              # 025 -> 25, 336^\circ -> 336
        assert reward(f"\\boxed{{{value + 1}}}", r.answers[0]) == -1.0
    answers = [r.answers[0] for r in records]
    if name == "aime24":
        assert answers[:2] == ["204", "025"]
    if name == "aime25":
        assert answers[19] == "336^\\circ"
    if name == "amc23":
        assert answers[:3] == ["142", "144", "81"]                         # floats 142.0, ...
        assert reward("\\boxed{\\frac{284}{2}}", "142") == 1.0


@pytest.mark.parametrize("answer,gold,expected", [
    ("\\frac{1}{2}", "0.5", True), ("0.5", "\\frac{1}{2}", True), ("\\dfrac{1}{2}", "\\frac12", True),
    ("1/2", "\\frac{1}{2}", True), ("\\frac{2}{4}", "\\frac{1}{2}", True), ("0.25", "\\frac{1}{2}", False),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True), ("\\sqrt{2}", "\\frac{1}{2}", False),
    ("2,125", "2125", True), ("\\$18", "18", True),
])
def test_fractions_and_forms(answer, gold, expected):
    assert reward("\\boxed{" + answer + "}", gold) == (1.0 if expected else -1.0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("text", [
    "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",     # 10,000 nested braces
    "\\boxed{" + "1" * 1_000_000 + "}",                         # a 1 MB answer
    "\\boxed{" * 150_000,                                        # 1 MB of unclosed boxes
    "x" * 1_000_000,                                             # 1 MB, no box
    "the answer is \\boxed{",                                    # unclosed
    "\\boxed{\\sum_{k=1}^{9999}k^{9999}}",                      # passes the guard; sympy never returns
    "\\boxed{(x+1)^{1000}}",                                    # passes the guard; ~9 s in sympy
])
def test_hostile_answers_score_minus_one(text):
    assert reward(text, "1", timeout=1.0) == -1.0


@pytest.mark.timeout(120)
def test_checker_recovers_after_a_stuck_check_and_works_in_threads():
    from concurrent.futures import ThreadPoolExecutor

    cases = [("\\boxed{\\frac{1}{2}}", "0.5", True), ("\\boxed{\\sum_{k=1}^{9999}k^{9999}}", "1", False),
             ("\\boxed{0.5}", "\\frac{1}{2}", True), ("\\boxed{7.0}", "8", False)] * 2
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda c: check(c[0], c[1], timeout=1.0), cases))
    assert got == [c[2] for c in cases]
    assert check("\\boxed{\\frac{3}{6}}", "0.5")


def test_normalize_answer():
    assert normalize_answer("He paid 5 + 5 = 10\n#### 1,000") == "1000"
    assert normalize_answer(142.0) == "142" and normalize_answer(0.5) == "0.5" and normalize_answer(7) == "7"
    assert normalize_answer(["\\frac{1}{2}"]) == "\\frac{1}{2}"
    assert normalize_answer("so \\boxed{2} or rather \\boxed{\\frac{1}{3}}") == "\\frac{1}{3}"
    assert normalize_answer(" 025 ") == "025" and normalize_answer("1,2") == "1,2"   # not a thousands separator
    for bad in (None, True, [], ["1", "2"], "", "#### ", "\\boxed{3", float("nan")):
        with pytest.raises(ValueError):
            normalize_answer(bad)


# --------------------------------------------------------------------------- layouts


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_rl_layout_in_jsonl_math_layout_and_named_keys(tmp_path):
    rl = _write_jsonl(tmp_path / "rl.jsonl", [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+2?"}],
         "reward_model": {"ground_truth": "3", "style": "rule"}}])
    rec = to_record(read_rows(rl)[0], 0)
    assert rec.answers[0] == "3" and [m["role"] for m in rec.messages] == ["system", "user"]
    assert render_prompt(rec.messages) == "Be brief.\n\n1+2? " + BOXED_INSTRUCTION

    math = _write_jsonl(tmp_path / "math.jsonl", [{"problem": "Half of 1?", "solution": "It is \\boxed{\\frac12}."}])
    assert to_record(read_rows(math)[0], 0).answers == ("\\frac12",)

    custom = _write_jsonl(tmp_path / "custom.jsonl", [{"q": "2*3?", "meta": {"gold": 6}}])
    row = read_rows(custom)[0]
    with pytest.raises(UserError, match=r"row 0: no prompt column .*the row has q, meta.*data.prompt_key"):
        to_record(row, 0)
    assert to_record(row, 0, prompt_key="q", answer_key="meta.gold").answers == ("6",)


def test_bad_sources_get_clear_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1?", "answer": "#### 1"}\n{oops\n')
    with pytest.raises(UserError, match=r"bad.jsonl:2: invalid JSON line"):
        read_rows(str(bad))
    with pytest.raises(UserError, match="no such file"):
        read_rows(str(tmp_path / "missing.parquet"))
    with pytest.raises(UserError, match=r"is not one of: synthetic:arithmetic, a .jsonl/.json/.parquet file, hf:NAME"):
        read_rows("prompts.csv")
    empty = _write_jsonl(tmp_path / "empty.jsonl", [{"question": "1?", "answer": []}])
    with pytest.raises(UserError, match=r"row 0: answer: an empty list of answers"):
        load_problems(empty, held_out=1)
    nested = _write_jsonl(tmp_path / "nested.jsonl", [{"question": "1?", "answer": ["1", None]}])
    with pytest.raises(UserError, match=r"row 0: answer: answer 1 of 2: no answer \(None\)"):
        load_problems(nested, held_out=1)


def test_rows_with_several_gold_answers_load_and_any_of_them_is_right(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = _write_jsonl(tmp_path / "lists.jsonl", [
        {"question": "Solve $x^2 = 16$ for $x > 0$.", "answer": ["4", "x=4", 4.0]},
        {"question": "Half of 1?", "answer": ["\\frac{1}{2}", "0.5"]},
        {"question": "One?", "answer": "1"}])
    verl = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"prompt": [{"role": "user", "content": "Speed of light, m/s?"}],
         "reward_model": {"ground_truth": ["3 \\times 10^{8}", "299792458"], "style": "rule"}},
        {"prompt": [{"role": "user", "content": "Two?"}], "reward_model": {"ground_truth": ["2"], "style": "rule"}}]),
        verl)
    column = tmp_path / "column.parquet"
    pq.write_table(pa.table({"problem": ["A?", "B?"], "final_answer": [["1", "one"], ["2"]]}), column)
    assert pq.read_schema(verl).field("reward_model").type.field("ground_truth").type == pa.list_(pa.string())

    records = [to_record(r, i) for i, r in enumerate(read_rows(jsonl))]
    assert [r.answers for r in records] == [("4", "x=4"), ("\\frac{1}{2}", "0.5"), ("1",)]   # 4.0 is "4": kept once
    assert [to_record(r, i).answers for i, r in enumerate(read_rows(str(verl)))] == [
        ("3 \\times 10^{8}", "299792458"), ("2",)]
    assert [to_record(r, i).answers for i, r in enumerate(read_rows(str(column)))] == [("1", "one"), ("2",)]

    train, held, _ = load_problems(str(verl), held_out=1, seed=0)
    light = next(p for p in train + held if "light" in p.prompt)
    assert light.answer == Gold(("3 \\times 10^{8}", "299792458"))
    assert reward("\\boxed{299792458}", light.answer) == 1.0 and reward("\\boxed{3e8}", light.answer) == 1.0
    assert reward("\\boxed{2.99792458e8}", light.answer) == 1.0 and reward("\\boxed{3e9}", light.answer) == -1.0
    train, held, _ = load_problems(jsonl, held_out=1, seed=0)
    solve = next(p for p in train + held if "Solve" in p.prompt)
    assert [check(f"\\boxed{{{a}}}", solve.answer) for a in ("x=4", "4", "4.0", "-4", "x=-4")] == [
        True, True, True, False, False]


def test_think_tags_reach_training_and_held_out_problems():
    """``model.think_tags``: every problem of both splits, real or synthetic, is graded after
    its completion's last ``</think>``; the rollout scorer gives the rewards it implies."""
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.rollout.base import Completion
    from scalectl.rl.reward.scoring import scorer_for
    from scalectl.rl.rollout.groups import score_groups

    for data in ({"source": str(MATH / "aime24.parquet")}, {"source": "synthetic:arithmetic", "train_size": 40}):
        base = Recipe.model_validate({"data": data, "eval": {"prompts": 10}})
        thinking = Recipe.model_validate({"data": data, "eval": {"prompts": 10}, "model": {"think_tags": True}})
        assert base.content_hash != thinking.content_hash
        plain_train, plain_held = load_prompt_sets(base)
        train, held = load_prompt_sets(thinking)
        assert [p.prompt for p in train + held] == [p.prompt for p in plain_train + plain_held]
        assert all(p.answer.think_tags for p in train + held)
        gold = held[0].answer.answers[0]
        texts = [f"<think>maybe \\boxed{{{gold}}}", f"<think>hmm</think> \\boxed{{{gold}}}",
                 f"\\boxed{{{gold}}}", f"<think>\\boxed{{{gold}}}</think> no box"]
        comps = [Completion(0, [1], [2], [-0.5], [0], "stop", t) for t in texts]
        [group] = score_groups([comps], held, [0], thinking.length, scorer_for(thinking))
        assert group.correct == [False, True, False, False]
        # without think tags an unclosed block is cut; the rest is graded whole
        assert [check(t, plain_held[0].answer) for t in texts] == [False, True, True, True]


@pytest.mark.parametrize("name", ["gsm8k-test.jsonl", "aime24.parquet", "aime25.parquet", "amc23.parquet"])
def test_every_real_gold_answer_equals_itself_and_its_scientific_notation(name):
    """Each row's gold answer scores +1 against itself and against the same number in
    e-notation and in ``\\times 10^{}`` notation; one more than it scores -1 in both."""
    records = to_records(MATH / name)
    counts = {"self": 0, "e": 0, "times": 0, "wrong": 0}
    for r in records:
        [gold] = r.answers
        value = int(gold.removesuffix("^\\circ"))
        digits = max(len(str(abs(value))) - 1, 1)                            # every digit: exact
        mantissa, exponent = f"{value:.{digits}e}".split("e")
        counts["self"] += reward(f"\\boxed{{{gold}}}", gold) == 1.0
        counts["e"] += reward(f"\\boxed{{{value:.{digits}e}}}", gold) == 1.0           # 70000 -> 7.0000e+04
        counts["times"] += reward(f"\\boxed{{{mantissa} \\times 10^{{{int(exponent)}}}}}", gold) == 1.0
        counts["wrong"] += (reward(f"\\boxed{{{value + 1:e}}}", gold) == -1.0
                            and reward(f"\\boxed{{{value + 1} \\cdot 10^{{0}}}}", gold) == -1.0)
    assert counts == dict.fromkeys(counts, len(records))


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets is installed")
def test_hf_source_without_datasets_says_what_to_do():
    with pytest.raises(UserError, match=r"hf:openai/gsm8k' needs the Hugging Face datasets package"):
        read_rows("hf:openai/gsm8k", split="test", subset="main")


@pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="datasets is not installed")
def test_hf_source_from_a_local_folder(tmp_path):
    import datasets

    rows = read_rows(str(GSM8K))[:20]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "gsm"))
    train, held, _ = load_problems(f"hf:{tmp_path / 'gsm'}", held_out=5)
    assert len(train) == 15 and len(held) == 5


# --------------------------------------------------------------------------- split and rendering


def test_held_out_split_is_fixed_size_disjoint_and_drawn_by_seed():
    train, held, info = load_problems(str(GSM8K), held_out=1000, seed=0)
    assert (len(train), len(held)) == (319, 1000) and info["duplicates"] == 0
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert {p.row for p in train} | {p.row for p in held} == set(range(1319))
    assert [p.id for p in held] == list(range(1000)) and [p.id for p in train] == list(range(319))
    again_train, again_held, _ = load_problems(str(GSM8K), held_out=1000, seed=0, train_size=100)
    assert again_held == held and again_train == train[:100]          # held-out does not depend on train_size
    _, other, _ = load_problems(str(GSM8K), held_out=1000, seed=1)
    assert {p.row for p in other} != {p.row for p in held}
    with pytest.raises(UserError, match=r"eval.prompts = 1319 .* this one has 1319"):
        split_indices(1319, 1319, 0)


def test_split_indices_partition():
    train, held = split_indices(10, 3, seed=5)
    assert len(held) == 3 and sorted([*train, *held]) == list(range(10))


def test_duplicates_are_kept_once_before_the_split(tmp_path):
    rows = [{"question": f"{i}+{i}?", "answer": f"#### {2 * i}"} for i in range(10)] * 2
    train, held, info = load_problems(_write_jsonl(tmp_path / "dup.jsonl", rows), held_out=4)
    assert info["duplicates"] == 10 and len(train) + len(held) == 10
    assert not {p.prompt for p in train} & {p.prompt for p in held}


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_prompts_render_with_the_chat_template_or_as_plain_text(gsm8k):
    from scalectl.rl.policy.model import build_tokenizer

    tok = build_tokenizer()
    question = gsm8k[1].messages[0]["content"]
    assert render_prompt(gsm8k[1].messages) == question + " " + BOXED_INSTRUCTION
    with pytest.raises(UserError, match="cannot apply a chat template"):
        render_prompt(gsm8k[1].messages, tokenizer=tok, chat_template=True)
    tok.chat_template = CHATML
    assert render_prompt(gsm8k[1].messages, tokenizer=tok, chat_template=True) == (
        f"<|im_start|>user\n{question} {BOXED_INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
    tok.chat_template = "{{ bos_token }}" + CHATML                  # BOS is the engines' to add
    assert render_prompt(gsm8k[1].messages, tokenizer=tok, chat_template=True).startswith("<|im_start|>user\n")
    aime = to_record(read_rows(str(MATH / "aime24.parquet"))[0], 0)
    assert render_prompt(aime.messages) == aime.messages[0]["content"]   # already asks for \boxed{}


def test_load_prompt_sets_from_a_recipe_drops_long_prompts():
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.data.splits import load_prompt_sets
    from scalectl.rl.policy.model import build_tokenizer

    recipe = Recipe.model_validate({"data": {"source": str(GSM8K), "train_size": 200, "seed": 3},
                                    "eval": {"prompts": 100}, "length": {"max_prompt_tokens": 300}})
    lines = []
    train, held = load_prompt_sets(recipe, log=lines.append)
    # the tiny tokenizer: one token per UTF-8 byte, "\boxed{" one token, plus BOS
    texts = [render_prompt(r.messages) for r in to_records(GSM8K)]
    tokens = [len(t.encode()) - 6 * t.count("\\boxed{") + 1 for t in texts]
    short, longest = sum(n <= 300 for n in tokens), max(tokens)
    assert 100 < short < 1319 and longest > 300
    assert (len(train), len(held)) == (200, 100)
    # the longest prompt named, and the limit that keeps every prompt
    assert lines == [f"prompt set {GSM8K}: 1319 rows, 0 duplicates (0 near-duplicates), {1319 - short} longer than 300 tokens "
                     f"(the longest {longest:,} tokens: --set length.max_prompt_tokens={longest} keeps them); "
                     f"200 training, 100 held-out prompts"]
    tok = build_tokenizer()
    assert all(len(tok.encode(p.prompt, add_special_tokens=False)) + 1 <= 300 for p in train + held)
    with pytest.raises(UserError, match=(rf"no usable prompt \(1319 rows, 0 duplicates, 1319 longer than "
                                         rf"length.max_prompt_tokens = 20\); --set length.max_prompt_tokens={longest} "
                                         rf"keeps them all \(the longest prompt has {longest} tokens\)")):
        load_prompt_sets(recipe.model_copy(update={"length": recipe.length.model_copy(
            update={"max_prompt_tokens": 20})}))


def to_records(path):
    return [to_record(r, i) for i, r in enumerate(read_rows(str(path)))]


def test_synthetic_prompts_longer_than_the_limit_are_dropped_and_counted():
    """Every source drops prompts over length.max_prompt_tokens, the synthetic one too: at
    difficulty 9 (8 terms of up to 3 digits) a prompt has up to 32 characters, 33 tokens with
    BOS for the tiny tokenizer (one token per character)."""
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.data.arithmetic import make_splits
    from scalectl.rl.data.splits import load_prompt_sets

    recipe = Recipe.model_validate({"data": {"source": "synthetic:arithmetic", "difficulty": 9, "train_size": 400},
                                    "eval": {"prompts": 100}, "length": {"max_prompt_tokens": 32}})
    generated = make_splits(400, 100, seed=0, difficulty=9)
    over = [sum(len(p.prompt) + 1 > 32 for p in split) for split in generated]      # the count by hand
    assert 0 < over[0] < 400 and 0 < over[1] < 100
    lines = []
    train, held = load_prompt_sets(recipe, log=lines.append)
    longest = max(len(p.prompt) + 1 for p in train + held)
    print(f"\ngenerated over the limit: {over[0]} of 400 training, {over[1]} of 100 held-out; "
          f"after loading: longest prompt {longest} tokens, {len(train)} + {len(held)} prompts")
    assert longest <= 32
    assert [p.prompt for p in train] == [p.prompt for p in generated[0] if len(p.prompt) + 1 <= 32]
    assert [p.prompt for p in held] == [p.prompt for p in generated[1] if len(p.prompt) + 1 <= 32]
    assert [p.id for p in train] == list(range(len(train))) and [p.id for p in held] == list(range(len(held)))
    assert lines == [f"prompt set synthetic:arithmetic: {sum(over)} longer than 32 tokens dropped; "
                     f"{400 - over[0]} training, {100 - over[1]} held-out prompts"]
    # at the limit nothing is dropped (and the splits are the generated ones)
    loose = recipe.model_copy(update={"length": recipe.length.model_copy(update={"max_prompt_tokens": 33})})
    assert load_prompt_sets(loose) == generated
    with pytest.raises(UserError, match="no training prompt fits length.max_prompt_tokens = 5"):
        load_prompt_sets(recipe.model_copy(update={"length": recipe.length.model_copy(
            update={"max_prompt_tokens": 5})}))
