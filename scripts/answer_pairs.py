"""Answer pairs for measuring the checker: real benchmark gold answers, each with the variants
a model writes for it (equal) and with changes that make it another answer (unequal).

    python scripts/answer_pairs.py            # writes tests/data/math/answer-pairs.jsonl
    python scripts/answer_pairs.py --measure  # and prints false negatives / false positives
    python scripts/answer_pairs.py --held-out # the same rules on golds the checker was not written
                                              # against (MATH, college math), measured, not written

The gold answers are those of tests/data/math/benchmark-answers.jsonl (Minerva Math and
OlympiadBench rows; provenance in tests/data/math/README.md).  Every variant is made by a
rule named in its ``kind`` (one pair per rule that applies to the gold), so the label holds
by construction:

equal (the same answer, written as models write it)
    ``dollars`` the answer in ``$...$``; ``gold_dollars`` the gold in ``$...$``;
    ``parens`` in ``\\(...\\)``; ``tight`` spaces removed (not between two letters or two
    digits); ``loose`` spaces around ``= + , ( )``; ``thin`` TeX thin spaces after commas
    and around ``=``; ``dfrac`` ``\\frac`` written ``\\dfrac``; ``left_right`` ``\\left(``
    ``\\right)``; ``period`` a full stop after it; ``unit_added`` a number with a unit the
    gold does not name (``9.6 \\text{ nm}`` for ``9.6``); ``unit_dropped`` the gold's unit
    left out; ``times_ten`` e-notation written ``\\times 10^{}``; ``percent`` a percent
    gold without its sign, or in ``$...\\%$``.

unequal (another answer)
    ``digit`` the last digit of the first number changed; ``sign`` a minus put before the
    answer or taken away (``-(...)`` around a tuple, an interval or an equation);
    ``scale_word`` a number followed by ``\\text{ thousand}`` or ``\\text{k}`` (units that
    change the value); ``other_unit`` the gold's unit with another prefix; ``prime`` a
    variable primed (``x'`` for ``x``); ``dropped`` the last element of a list left out;
    ``inverted`` a fraction upside down.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "math" / "benchmark-answers.jsonl"
HELD_OUT = ROOT / "tests" / "data" / "math" / "heldout-answers.jsonl"
PAIRS = ROOT / "tests" / "data" / "math" / "answer-pairs.jsonl"

NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)(e-?\d+)?$")
UNITS = [r"\text{ m}", r"\,\mathrm{nm}", r"~\text{kg}", r"\text{ s}", r"\mathrm{~K}", r"\text{ eV}",
         r"^{\circ}", r"\text{ cm}^2", r"\ \text{m/s}", r" \mathrm{J}"]
PREFIXES = {"km": "m", "m": "km", "cm": "mm", "km/h": "m/h", "$cm^2$": "$mm^2$"}


def _gold_with_unit(row) -> str | None:
    unit = row.get("unit")
    if not unit:
        return None
    return f"{row['gold']} \\text{{ {unit.strip('$')} }}"


def _variable(gold: str) -> re.Match | None:
    """A single-letter variable in math (not part of a command or a word)."""
    return re.search(r"(?<![\\A-Za-z])[a-zA-Z](?![A-Za-z{])", re.sub(r"\\[A-Za-z]+", lambda m: "#" * len(m[0]), gold))


def equal_variants(row) -> list[tuple[str, str, str]]:
    """(kind, answer, gold) pairs that are the same answer."""
    g = row["gold"]
    out = [("dollars", f"${g}$", g), ("gold_dollars", g, f"${g}$"), ("parens", f"\\({g}\\)", g),
           ("period", f"{g}.", g)]
    tight = re.sub(r"(?<![A-Za-z0-9]) +| +(?![A-Za-z0-9])", "", g)
    if tight != g:
        out.append(("tight", tight, g))
    loose = re.sub(r"\s*([=+,()])\s*", r" \1 ", g).strip()
    if loose != g:
        out.append(("loose", loose, g))
    thin = re.sub(r",\s*", r",\\, ", g)
    thin = re.sub(r"\s*=\s*", r" \\,=\\, ", thin)
    if thin != g:
        out.append(("thin", thin, g))
    if "\\frac" in g:
        out.append(("dfrac", g.replace("\\frac", "\\dfrac"), g))
    if "(" in g and ")" in g and "\\left" not in g:
        out.append(("left_right", g.replace("(", "\\left(").replace(")", "\\right)"), g))
    if NUMBER.match(g) and not row.get("unit"):
        unit = UNITS[row["idx"] % len(UNITS)]
        out.append(("unit_added", f"{g}{unit}", g))
    with_unit = _gold_with_unit(row)
    if with_unit:
        out.append(("unit_dropped", g, with_unit))
    m = re.fullmatch(r"(-?[\d.]+)e(-?\d+)", g)
    if m:
        out.append(("times_ten", f"{m[1]} \\times 10^{{{int(m[2])}}}", g))
    if g.endswith("\\%"):
        out.append(("percent", g[:-2].strip(), g))
        out.append(("percent", f"${g[:-2].strip()} \\%$", g))
    return out


def unequal_variants(row) -> list[tuple[str, str, str]]:
    """(kind, answer, gold) pairs that are different answers."""
    g = row["gold"]
    out = []
    m = re.search(r"\d+", g)
    if m:
        digits = m[0]
        changed = digits[:-1] + str((int(digits[-1]) + 1) % 10)
        out.append(("digit", g[:m.start()] + changed + g[m.end():], g))
    top = g.strip()
    if re.fullmatch(r"-?0(\.0*)?", top):
        pass                                   # -0 is 0
    elif top.startswith("-") and not top.startswith("-("):
        out.append(("sign", top[1:], g))
    elif "=" in top or "," in top or top.startswith(("(", "[")):
        out.append(("sign", f"-({top})", g))
    elif top and top[0] not in "+\\" or NUMBER.match(top):
        out.append(("sign", f"-{top}", g))
    if NUMBER.match(g) and g not in ("0", "0.0"):
        out.append(("scale_word", f"{g}\\text{{ thousand}}", g))
        out.append(("scale_word", f"{g} \\text{{k}}", g))
    with_unit = _gold_with_unit(row)
    if with_unit and row["unit"] in PREFIXES:
        out.append(("other_unit", f"{g} \\text{{ {PREFIXES[row['unit']].strip('$')} }}", with_unit))
    v = _variable(g)
    if v:
        out.append(("prime", g[:v.end()] + "'" + g[v.end():], g))
    items = g.split(",")
    if len(items) > 1 and len(set(items)) == len(items) and not any(c in g for c in "()[]{}"):
        out.append(("dropped", g.rsplit(",", 1)[0], g))
    f = re.fullmatch(r"(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}", g)
    if f and f[2] != f[3]:
        out.append(("inverted", f"{f[1]}\\frac{{{f[3]}}}{{{f[2]}}}", g))
    return out


def pairs(source: Path = SOURCE) -> list[dict]:
    """Every pair of every gold answer in ``source`` (a benchmark-answers file), in file order."""
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    out = []
    for row in rows:
        ident = f"{row['set']}/{row['idx']}"
        for label, variants in (("equal", equal_variants(row)), ("unequal", unequal_variants(row))):
            for kind, answer, gold in variants:
                out.append({"id": ident, "label": label, "kind": kind, "answer": answer, "gold": gold})
    return out


def measure(rows: list[dict]) -> dict:
    """False negatives (equal pairs rejected) and false positives (unequal pairs accepted),
    with the checker's internal errors, over ``rows``."""
    from scalectl.rl.reward.checker import judge

    result = {"equal": 0, "unequal": 0, "false_negatives": [], "false_positives": [], "errors": []}
    for row in rows:
        verdict = judge(row["answer"], row["gold"])
        result[row["label"]] += 1
        if verdict.error:
            result["errors"].append((row, verdict.error))
        if row["label"] == "equal" and not verdict.correct:
            result["false_negatives"].append(row)
        if row["label"] == "unequal" and verdict.correct:
            result["false_positives"].append(row)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="check every pair and print the misses")
    ap.add_argument("--held-out", action="store_true", help=f"measure the pairs of {HELD_OUT.name} instead")
    args = ap.parse_args(argv)
    if args.held_out:
        rows = pairs(HELD_OUT)
        print(f"{len(rows)} pairs ({sum(r['label'] == 'equal' for r in rows)} equal) of {HELD_OUT.name}")
    else:
        rows = pairs()
        PAIRS.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        print(f"{len(rows)} pairs ({sum(r['label'] == 'equal' for r in rows)} equal) -> {PAIRS.relative_to(ROOT)}")
    if args.measure or args.held_out:
        res = measure(rows)
        for name, total in (("false_negatives", res["equal"]), ("false_positives", res["unequal"])):
            misses = res[name]
            print(f"{name}: {len(misses)} of {total} ({100 * len(misses) / max(total, 1):.2f} %)")
            for r in misses:
                print(f"   {r['kind']:12} {r['answer']!r}  gold {r['gold']!r}")
        print(f"checker errors: {len(res['errors'])}")
        for r, err in res["errors"][:20]:
            print(f"   {r['answer']!r} gold {r['gold']!r}: {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
