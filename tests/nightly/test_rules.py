"""Each rule against hand-computed changes: fires just past its threshold, not at it, and never without a baseline."""

import pytest

from mmtrt.nightly.config import Rules
from mmtrt.nightly.rules import check


def result(metrics, **kw):
    return {"status": "ok", "metrics": metrics, "cache": "hit", **kw}


@pytest.mark.parametrize("metric, base, now, rule, fires", [
    ("parity.top1_agreement_pct", 100.0, 99.0, "accuracy_drop_points", False),   # 1 point: at the limit
    ("parity.top1_agreement_pct", 100.0, 98.9, "accuracy_drop_points", True),
    ("digits.accuracy_pct", 90.0, 95.0, "accuracy_drop_points", False),           # better is never a regression
    ("perplexity.perplexity", 100.0, 102.0, "perplexity_increase_pct", False),
    ("perplexity.perplexity", 100.0, 102.5, "perplexity_increase_pct", True),
    ("bench.prefill_ms_ratio", 1.0, 1.24, "latency_ratio_increase_pct", False),
    ("bench.prefill_ms_ratio", 0.8, 1.01, "latency_ratio_increase_pct", True),    # +26 % of the ratio
    ("bench.prefill_ms", 1.0, 9.0, "latency_ratio_increase_pct", False),          # absolute times: never compared
    ("build.bundle_mb", 10.0, 10.6, "bundle_size_increase_pct", True),
])
def test_metric_rules(metric, base, now, rule, fires):
    fired = check(result({metric: now}), {"metrics": {metric: base}, "cache": "hit"}, Rules())
    assert [f["rule"] for f in fired] == ([rule] if fires else [])
    if fires:
        assert fired[0]["baseline"] == base and fired[0]["current"] == now


def test_a_rule_set_to_null_is_off_and_no_baseline_compares_nothing():
    drop = ({"parity.top1_agreement_pct": 50.0}, {"metrics": {"parity.top1_agreement_pct": 100.0}})
    assert check(result(drop[0]), drop[1], Rules(accuracy_drop_points=None)) == []
    assert check(result(drop[0]), None, Rules()) == []


def test_failed_build_and_nondeterminism():
    failed = {"status": "failed", "error": "compile: model folder x does not exist", "metrics": {}}
    assert check(failed, None, Rules()) == [{"rule": "failed_build", "message": failed["error"]}]
    assert check(failed, None, Rules(failed_build=False)) == []
    odd = result({}, nondeterministic="inputs ab gave bundle cd before and ef now")
    assert [f["rule"] for f in check(odd, None, Rules())] == ["nondeterminism"]
    assert check(odd, None, Rules(nondeterminism=False)) == []


def test_compile_time_only_when_both_nights_compiled():
    rules = Rules(compile_time_increase_pct=50)
    base = {"metrics": {"build.compile_s": 10.0}, "cache": "miss"}
    assert [f["rule"] for f in check(result({"build.compile_s": 16.0}, cache="miss"), base, rules)] == \
        ["compile_time_increase_pct"]
    assert check(result({"build.compile_s": 16.0}, cache="hit"), base, rules) == []
