"""Quality budgets (``diffaccel.tuning.budget``): the expressions ``tune`` takes, good and bad."""

import math

import pytest

from diffaccel import ConfigError
from diffaccel.tuning.budget import parse, parse_all

TEXT_KEYS = ["perplexity", "distinct_1", "distinct_2", "agreement", "gen_ppl"]
IMAGE_KEYS = ["psnr", "psnr_min", "ssim", "cond_acc"]


@pytest.mark.parametrize("expr, metric, op, kind, value", [
    ("gen_ppl<=+5%", "gen_ppl", "<=", "relative", 0.05),
    ("distinct2>=-5%", "distinct_2", ">=", "relative", -0.05),
    ("acc>=-0.02", "cond_acc", ">=", "delta", -0.02),
    ("psnr>=30", "psnr", ">=", "absolute", 30.0),
    (" ssim >= 0.9 ", "ssim", ">=", "absolute", 0.9),
    ("gen_ppl < +1.5e1%", "gen_ppl", "<", "relative", 0.15),
])
def test_good_expressions(expr, metric, op, kind, value):
    b = parse(expr, TEXT_KEYS + IMAGE_KEYS)
    assert (b.metric, b.op, b.kind) == (metric, op, kind)
    assert b.value == pytest.approx(value)


def test_bounds_read_against_the_baseline():
    rel = parse("gen_ppl<=+5%")
    assert rel.met(104.9, 100.0) and not rel.met(105.1, 100.0)
    assert rel.margin(100.0, 100.0) == pytest.approx(5.0)
    delta = parse("acc>=-0.02")
    assert delta.met(0.49, 0.5) and not delta.met(0.47, 0.5)
    absolute = parse("psnr>=30")
    assert absolute.met(30.0, math.inf) and not absolute.met(29.9, math.inf)
    strict = parse("psnr>30")
    assert not strict.met(30.0) and strict.met(30.01)
    assert parse("distinct2>=-5%").check({"distinct_2": 0.9}, {"distinct_2": 1.0}) == (False, pytest.approx(-0.05))
    assert parse("gen_ppl<=+5%").check({}, {"gen_ppl": 1.0})[0] is False  # not measured: not met
    assert not rel.met(float("nan"), 100.0)


@pytest.mark.parametrize("expr, says", [
    ("gen_ppl<=5%", "write it signed (+5% or -5%)"),
    ("gen_ppl=+5%", "not a budget"),
    ("gen_ppl<=", "not a budget"),
    ("<=+5%", "not a budget"),
    ("bleu>=0.3", "metric 'bleu' is not reported for this config; reported: agreement, distinct_1"),
    ("psnr>=-5%", "only an absolute bound means something, e.g. psnr>=5"),
    ("agreement>=-0.1", "only an absolute bound"),
])
def test_bad_expressions_are_one_line(expr, says):
    with pytest.raises(ConfigError) as err:
        parse(expr, TEXT_KEYS + IMAGE_KEYS if "bleu" not in expr else TEXT_KEYS)
    msg = str(err.value)
    assert says in msg and "\n" not in msg and msg.startswith(f"--budget {expr!r}")


def test_image_metric_on_a_text_config_is_refused():
    with pytest.raises(ConfigError, match="metric 'psnr' is not reported"):
        parse("psnr>=30", TEXT_KEYS)


def test_parse_all_refuses_a_metric_bounded_twice_the_same_way_and_none():
    assert [b.metric for b in parse_all(["gen_ppl<=+5%", "gen_ppl>=-50%"])] == ["gen_ppl", "gen_ppl"]
    with pytest.raises(ConfigError, match="already bounded by 'gen_ppl<=\\+5%'"):
        parse_all(["gen_ppl<=+5%", "gen_ppl<=+10%"])
    with pytest.raises(ConfigError, match="give at least one"):
        parse_all([])
