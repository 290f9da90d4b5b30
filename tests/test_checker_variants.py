"""The checker against the ways models write a right answer, and against near misses.

* delimiters and spacing never change a verdict (``$...$``, ``\\(...\\)``, ``\\left(``,
  thin spaces, spaces around operators);
* a unit the gold does not name is ignored, unless it is a multiplier; a unit the gold
  names must be the one written;
* tuple, set and percent golds compare without an internal error; an error (a partial parse,
  an exception) is reported in the verdict, and counted by a run (``checker_errors``);
* primes, a minus before a tuple or an equation, multiplier units are wrong;
* on tests/data/math/answer-pairs.jsonl (Minerva Math and OlympiadBench gold answers with
  the variants of scripts/answer_pairs.py), false negatives and false positives both stay
  below 1 %.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import ROOT
from scalectl.rl.reward.checker import check_verdict, judge, negated_group, score, without_delimiters, without_spacing
from scalectl.rl.reward.mathverify import numbers_agree, partial_parse, verify_here, _parse
from scalectl.rl.reward.numbers import is_scale, trailing_unit
from scalectl.rl.reward.scoring import Scorer
from scalectl.rl.reward.written import primed_names
from scalectl.rl.rollout.base import Completion
from scalectl.rl.rollout.groups import rollout_stats, score_groups

#: (answer, gold, equal?): pairs written for these rules, none taken from the pair file
PAIRS = [
    # delimiters, on either side
    ("f(z)=z", "$f(z)=z$", True),
    ("$f(z) = z$", "f(z)=z", True),
    ("8\\%", "$8 \\%$", True),
    ("\\[ \\frac{3}{4} \\]", "0.75", True),
    ("$$2\\sqrt{5}$$", "2\\sqrt{5}", True),
    ("x = $7$", "7", True),
    ("\\$5", "5", True),                                # a currency sign: a unit the gold does not name
    ("\\$5", "6", False),
    # spacing and sizes
    ("\\left( 2 ,\\, 3 \\right)", "(2,3)", True),
    ("(2, 3), (4, 5)", "(4,5),(2,3)", True),
    ("y \\, = \\, 3 x + 1", "y=3x+1", True),
    ("\\dfrac{7}{2}", "\\frac{7}{2}", True),
    ("\\displaystyle \\tfrac{1}{3}", "\\frac{1}{3}", True),
    ("\\sin \\theta", "\\sin\\theta", True),
    # units the gold does not name: ignored; multipliers are not units
    ("9.6 \\text{ nm}", "9.6", True),
    ("0.554\\,\\mathrm{m}", "0.554", True),
    ("45^{\\circ}", "45", True),
    ("\\frac{1}{2}\\text{ kg}", "0.5", True),
    ("12 \\text{ cm}^2", "12", True),
    ("300\\mathrm{~K}", "300", True),
    ("7\\text{ thousand}", "7", False),
    ("7 \\text{k}", "7", False),
    ("2\\text{ million}", "2", False),
    ("3\\,\\text{percent}", "3", False),
    # units the gold names: the same, or left out
    ("9.6 \\text{ nm}", "9.6 \\text{ nm}", True),
    ("9.6", "9.6 \\text{ nm}", True),
    ("9.6 \\text{ m}", "9.6 \\text{ nm}", False),
    ("9.6 \\text{ km}", "9.6\\,\\mathrm{m}", False),
    ("1.2 \\text{ nm}", "9.6 \\text{ nm}", False),
    ("9.6 \\text{ nm}", "9.5", False),
    ("30^{\\circ}", "60", False),
    # tuples, sets, percents
    ("(1,2),(3,4)", "(3,4),(1,2)", True),
    ("\\{(1, 2), (3, 4)\\}", "(1,2),(3,4)", True),
    ("(1,2),(3,5)", "(1,2),(3,4)", False),
    ("(62.5\\%, 2)", "(62.5\\%, 2)", True),
    ("62.5\\%", "62.5 \\%", True),
    ("37.5\\%", "62.5\\%", False),
    # negations math-verify drops
    ("-(x=1)", "x=1", False),
    ("-((1, 2))", "(1,2)", False),
    ("-[1, 2]", "[1,2]", False),
    ("-\\{3\\}", "\\{3\\}", False),
    ("-(x+y)=0", "x+y=0", True),                       # the same equation
    ("-(2,3)", "-(2,3)", True),
    # primes
    ("x' + y = 0", "x + y = 0", False),
    ("f'(x) = 2", "f(x)=2", False),
    ("y^{\\prime\\prime}+y=0", "y''+y=0", True),
    ("y'+y=0", "y''+y=0", False),
    ("y^{\\prime}", "y''", False),
    ("3x^{\\prime}", "3x'", True),
    # partial parses that made unequal answers equal
    ("\\frac{2}{3}E_{1}+\\frac{2}{3}E_{2}", "\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}", False),
    ("\\lambda_{\\text{red}}/\\sqrt{3}", "\\lambda_{\\text{red}}/\\sqrt{2}", False),
    # equations of numbers: math-verify calls two false ones equal
    ("\\cos(\\pi)=-2,\\sin(\\pi)=0", "\\cos(\\pi)=-1,\\sin(\\pi)=0", False),
    ("\\sin(\\pi)=0,\\cos(\\pi)=-1", "\\cos(\\pi)=-1,\\sin(\\pi)=0", True),
    ("2=-2", "2=-1", False),
    # a Greek assignment names nothing
    ("\\theta_a=\\arcsin(1.3\\sin\\theta_w)", "\\arcsin{1.3\\sin{\\theta_w}}", True),
    # a derivative written as a fraction: sympy read d x / d t as 0 (x does not depend on t), so
    # any multiple of the other side solved alike; it is a quantity of its own
    ("\\frac{dx}{dt}=-(kx-a)", "\\frac{dx}{dt}=kx-a", False),
    ("\\frac{dx}{dt}=2(kx-a)", "\\frac{dx}{dt}=kx-a", False),
    ("\\frac{dy}{dx}=4x", "\\frac{dy}{dx}=2x", False),
    ("\\frac{dy}{dx}=y", "\\frac{dy}{dx}=3y", False),
    ("\\frac{\\partial u}{\\partial t}=2ku", "\\frac{\\partial u}{\\partial t}=ku", False),
    ("\\frac{d}{dt}x=-kx", "\\frac{dx}{dt}=kx", False),
    ("\\frac{dy}{dx}", "0", False),
    ("\\frac{dx}{dt}=-a+kx", "\\frac{dx}{dt}=kx-a", True),
    ("\\frac{dx}{dt}-kx+a=0", "\\frac{dx}{dt}=kx-a", True),
    ("2\\frac{dx}{dt}=2kx-2a", "\\frac{dx}{dt}=kx-a", True),        # the same equation
    ("\\frac{\\mathrm{d}x}{\\mathrm{d}t}=kx-a", "\\frac{dx}{dt}=kx-a", True),
    ("\\frac{d}{dt}x=kx", "\\frac{dx}{dt}=kx", True),
    ("\\frac{dy}{dx}=x+x", "\\frac{dy}{dx}=2x", True),
    ("\\frac{\\partial u}{\\partial t}=uk", "\\frac{\\partial u}{\\partial t}=ku", True),
    # a number times a tuple: math-verify dropped the factor (read a set, or one element); the
    # factor is distributed over the elements, and refused where it cannot be
    ("2\\left((\\frac{1}{4}, \\frac{1}{27})\\right)", "(\\frac{1}{4}, \\frac{1}{27})", False),
    ("2(\\frac{1}{4},\\frac{1}{27})", "(\\frac{1}{4},\\frac{1}{27})", False),
    ("(\\frac{1}{4},\\frac{1}{27})\\cdot 2", "(\\frac{1}{4},\\frac{1}{27})", False),
    ("3(\\frac{1}{4}, 2)", "(\\frac{1}{4}, 2)", False),
    ("\\frac{1}{2}(1,3)", "(1,3)", False),
    ("2[1,3]", "[1,3]", False),
    ("2\\{1,2\\}", "\\{1,2\\}", False),
    ("2(1,3)+(0,1)", "(2,7)", False),
    ("2\\left((\\frac{1}{4}, \\frac{1}{27})\\right)", "(\\frac{1}{2}, \\frac{2}{27})", True),
    ("2(\\frac{1}{4},\\frac{1}{27})", "(\\frac{1}{2},\\frac{2}{27})", True),
    ("(\\frac{1}{4},\\frac{1}{27}) \\times 2", "(\\frac{1}{2},\\frac{2}{27})", True),
    ("\\frac{1}{2}(1,3)", "(\\frac{1}{2},\\frac{3}{2})", True),
    ("-2(1,3,5)", "(-2,-6,-10)", True),
    ("\\left((\\frac{1}{4}, \\frac{1}{27})\\right)", "(\\frac{1}{4}, \\frac{1}{27})", True),
    ("\\max(1,2)", "2", True),                                      # a function of a tuple, not a product
    ("\\sqrt{2}(1,2)", "(\\sqrt{2}, 2\\sqrt{2})", True),
    ("\\sqrt{2}(1,2)", "(\\sqrt{2}, \\sqrt{2})", False),
    ("2(1,x+1)", "(2,2x+2)", True),
    ("2(1,x+1)", "(2,x+2)", False),
    ("(-\\infty, 1) \\cup (2, \\infty)", "(2,\\infty)\\cup(-\\infty,1)", True),
]


@pytest.mark.parametrize("answer, gold, equal", PAIRS)
def test_pair(answer, gold, equal):
    verdict = judge(answer, gold, timeout=5.0)
    assert verdict.correct is equal, verdict


def test_the_table_is_balanced():
    assert len({(a, g) for a, g, _ in PAIRS}) == len(PAIRS)
    assert sum(ok for *_, ok in PAIRS) >= 20 and sum(not ok for *_, ok in PAIRS) >= 20


def test_normal_forms():
    assert without_delimiters("$$ \\(x\\) $$") == "x"
    assert without_delimiters("\\$5") == "\\$5"
    assert without_spacing("\\left( 1 ,\\; 2 \\right)") == "(1,2)"
    assert without_spacing("\\pi  t + 1 000") == "\\pi t+1 000"          # a command word; two digits
    assert without_spacing("5 \\text{ m s}") == "5\\text{ m s}"          # a text group keeps its spaces
    assert negated_group("-((1,2))") and negated_group("-(x=1)") and negated_group("-[0,1]")
    assert not negated_group("-(1)+(2)") and not negated_group("-(x+1)") and not negated_group("(1,2)")
    assert trailing_unit("3\\sqrt{2}\\,\\mathrm{m/s}^2") == ("3\\sqrt{2}", "m/s^2")
    assert trailing_unit("\\text{Paris}") is None and trailing_unit("x \\text{ for } x>0") is None
    assert is_scale("thousand") and is_scale("k") and not is_scale("km") and not is_scale("K")
    assert primed_names("x'_0 + y^{\\prime\\prime}") == ("x'", "y''")


def test_set_of_tuples_and_percent_agree_without_raising():
    # these raised inside the tolerance check ('Tuple' object has no attribute 'evalf';
    # '62.5*Abs(1/100)' is not comparable) and the error made a right answer wrong
    assert numbers_agree(_parse("(1,2,3),(1,3,2)")[0], _parse("(1,3,2),(1,2,3)")[0]) is True
    assert numbers_agree(_parse("(1,2,3),(1,3,2)")[0], _parse("(1,3,2),(1,2,4)")[0]) is False
    assert numbers_agree(_parse("62.5\\%")[0], _parse("\\frac{5}{8}")[0]) is True
    assert verify_here("(62.5\\%, 2)", "(62.5\\%, 2)") == (True, None)


def test_a_partial_parse_is_an_error_not_a_verdict():
    assert partial_parse("\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}", _parse("\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}"))
    assert partial_parse("x+1", _parse("x+1")) is None
    assert partial_parse("I(0)", _parse("I(0)")) is None            # a function of a number
    verdict = judge("\\frac{2}{3}E_{1}", "\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}")
    assert verdict.correct is False and "math-verify read" in verdict.error
    v = check_verdict("\\boxed{\\frac{2}{3}E_{1}}", "\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}")
    assert v.correct is False and v.error == verdict.error
    s = score("\\boxed{\\frac{2}{3}E_{1}}", "\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}")
    assert (s.reward, s.correct, s.error) == (-1.0, False, verdict.error)
    assert score("\\boxed{4}", "4").error is None


@pytest.mark.parametrize("answer, gold", [
    ("2[1,3]", "[1,3]"), ("2\\{1,2\\}", "\\{1,2\\}"), ("2(1,3)+(0,1)", "(2,7)"), ("(1,2)\\cdot 3+1", "(4,7)"),
    ("(1,2)", "2((1,2),(3,4))"),
])
def test_a_factor_that_cannot_be_distributed_is_a_partial_read_error(answer, gold):
    """A number times an interval or a set, or a scaled tuple inside a larger answer: the
    factor is not read (math-verify drops it), so the comparison is refused with an error a
    run counts."""
    verdict = judge(answer, gold, timeout=5.0)
    assert verdict.correct is False
    assert verdict.error is not None and "a factor beside a tuple, interval or set" in verdict.error, verdict


def test_a_run_counts_the_checker_errors_of_its_rollouts():
    class Problem:
        prompt = "?"
        answer = "\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}"

    class Length:
        control = "none"

    texts = ["\\boxed{\\frac{2}{3}E_{1}}", "\\boxed{7}", "no box", "\\boxed{\\frac{1}{3}E_{1}+\\frac{2}{3}E_{2}}"]
    comps = [Completion(prompt_index=0, prompt_ids=[1], token_ids=[1, 2], logprobs=torch.zeros(2),
                        versions=[0, 0], finish_reason="stop", text=t) for t in texts]
    groups = score_groups([comps], [Problem()], [0], Length(), Scorer())      # the built-in checker
    stats = rollout_stats(groups)
    # "7" is judged by math-verify too: the gold's partial parse is an error for it as well;
    # "no box" has no answer (no error); the identical answer is equal as a string
    assert stats["checker_errors"] == 2 and "math-verify read" in stats["checker_error"]
    assert groups[0].correct == [False, False, False, True]
    clean = score_groups([comps[2:3]], [Problem()], [0], Length(), Scorer())
    assert rollout_stats(clean)["checker_errors"] == 0 and "checker_error" not in rollout_stats(clean)


def _pairs():
    return [json.loads(line) for line in (ROOT / "tests/data/math/answer-pairs.jsonl").read_text().splitlines()]


def test_the_pair_file_is_what_the_script_writes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("answer_pairs", ROOT / "scripts" / "answer_pairs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.pairs() == _pairs()


def test_false_negatives_and_false_positives_below_one_percent():
    rows = _pairs()
    equal = [r for r in rows if r["label"] == "equal"]
    unequal = [r for r in rows if r["label"] == "unequal"]
    assert len(equal) >= 1000 and len(unequal) >= 1000
    false_neg = [r for r in equal if not judge(r["answer"], r["gold"]).correct]
    false_pos = [r for r in unequal if judge(r["answer"], r["gold"]).correct]
    assert len(false_neg) < 0.01 * len(equal), false_neg[:10]
    assert len(false_pos) < 0.01 * len(unequal), false_pos[:10]
