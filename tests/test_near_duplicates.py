"""No leak between the splits: near-duplicate prompts (equal up to whitespace, the case of
words and surrounding punctuation) are one problem, kept once before the held-out split,
and the run log says how many were dropped."""

from __future__ import annotations

import json

import pytest

from scalectl.rl.data.duplicates import first_of_each, prompt_key, text_key
from scalectl.rl.data.files import BOXED_INSTRUCTION, load_problems

#: ways of writing one prompt that do not change the problem
VARIANTS = [
    lambda q: q + " ",
    lambda q: q + "\n",
    lambda q: "  " + q.replace(" ", "  "),
    lambda q: q.replace("what", "WHAT").replace("Put", "put"),
    lambda q: q.rstrip("?") + ".",
    lambda q: f'"{q}"',
    lambda q: q + " " + BOXED_INSTRUCTION,
    lambda q: q.replace("$", "$ ").replace("+", " + "),
    lambda q: "\u200b" + q.replace(" ", "\t"),
]


def _prompts(n: int) -> list[str]:
    """Prompts that ask for a boxed answer themselves (as the AIME and Polaris sets do): the
    loader appends nothing, so a trailing space or newline reaches the rendered prompt."""
    return [f"Put the answer in \\boxed{{}}: what is ${i}+{i}$ plus {i}?" for i in range(n)]


def key(text: str) -> str:
    """The key of a one-message prompt, as the loader computes it."""
    return prompt_key([{"role": "user", "content": text}], drop=(BOXED_INSTRUCTION,))


@pytest.mark.parametrize("variant", range(len(VARIANTS)))
def test_each_variant_has_the_key_of_its_original(variant):
    q = _prompts(4)[3]
    assert key(VARIANTS[variant](q)) == key(q) == "user: put the answer in \\boxed{}: what is $3+3$ plus 3"


def test_what_changes_the_problem_changes_the_key():
    same = text_key
    assert same("Let $x = 2$. Find $x^2$.") != same("Let $X = 2$. Find $X^2$.")      # variables keep their case
    assert same("Let x be 2. Find x.") != same("Let X be 2. Find X.")
    assert same("Compute $3!$") != same("Compute $3$")                               # a factorial is not punctuation
    assert same("Find $f'$") != same("Find $f$") and same("Find f'") != same("Find f")
    assert same("Find $\\Delta$") != same("Find $\\delta$")                          # commands keep their case
    assert same("Find $\\alpha x$") != same("Find $\\alphax$")
    assert same("What is 12 plus 3?") != same("What is 1 2 plus 3?")                # a space in prose stays one
    assert same("What is 12 plus 3?") != same("What is 123 plus 3?")
    assert prompt_key([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1?"}]) != \
        prompt_key([{"role": "user", "content": "Be brief."}, {"role": "user", "content": "1+1?"}])
    assert first_of_each(["a", "b", "a", "c", "b"]) == [0, 1, 3]


def test_no_held_out_prompt_is_in_training(tmp_path):
    """60 problems, each also written in 1-3 near-duplicate forms, and 10 that differ from
    others only in a variable's case (distinct problems): with exact-text de-duplication
    copies of held-out prompts land in training; with the key none does."""
    originals = _prompts(60)
    rows, near = [], 0
    for i, q in enumerate(originals):
        rows.append({"question": q, "answer": str(3 * i)})
        for v in range(i % 3 + 1):
            rows.append({"question": VARIANTS[(i + v) % len(VARIANTS)](q), "answer": str(3 * i)})
            near += 1
    cases = [f"Let $x = {i}$. Find $2x$ in \\boxed{{}}." for i in range(10)]
    upper = [c.replace("x =", "X =").replace("2x", "2X") for c in cases]
    rows += [{"question": c, "answer": str(2 * (i % 10))} for i, c in enumerate(cases + upper)]
    rows += [{"question": originals[0], "answer": "0"}]                  # one exact copy
    src = tmp_path / "near.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))

    train, held, info = load_problems(str(src), held_out=25, seed=4)
    assert info["rows"] == len(rows) == 60 + near + 20 + 1
    assert (info["duplicates"], info["near_duplicates"]) == (near + 1, near)
    assert len(train) + len(held) == 60 + 20 and len(held) == 25

    held_keys, train_keys = {key(p.prompt) for p in held}, {key(p.prompt) for p in train}
    assert len(held_keys) == 25 and len(train_keys) == len(train)
    assert not held_keys & train_keys
    assert {key(q) for q in originals + cases + upper} == held_keys | train_keys
    # each kept prompt is the first written form, with its own gold answer
    first = {key(r["question"]): r for r in reversed(rows)}
    for p in train + held:
        row = first[key(p.prompt)]
        assert p.prompt == row["question"] and p.answer.answers == (row["answer"],)


def test_the_run_log_counts_near_duplicates(tmp_path):
    from scalectl.recipe.schema import Recipe
    from scalectl.rl.data.splits import load_prompt_sets

    rows = [{"question": q, "answer": "1"} for q in _prompts(8)]
    rows += [{"question": q + "\n", "answer": "1"} for q in _prompts(3)] + [rows[0]]
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = Recipe.model_validate({"data": {"source": str(src)}, "eval": {"prompts": 2}})
    lines = []
    train, held = load_prompt_sets(recipe, log=lines.append)
    assert (len(train), len(held)) == (6, 2)
    assert lines == [f"prompt set {src}: 12 rows, 4 duplicates (3 near-duplicates), 0 longer than "
                     f"{recipe.length.max_prompt_tokens} tokens; 6 training, 2 held-out prompts"]
