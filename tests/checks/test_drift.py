"""Drift statistics against hand-checked cases and scipy; novelty, support, windows, summaries."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from service.checks.drift import (
    NO_DECISION,
    PSI_FLOOR,
    Categories,
    FlagRule,
    WindowAccumulator,
    arrival_statistic,
    build_reference,
    calibrate,
    calibrate_arrival,
    gap_statistic,
    ks_pvalue,
    model_family_of,
    positive_gaps,
    psi,
    request_categories,
    select_rule,
    with_model_families,
)
from service.contract import DEFAULT_FEATURES, FEATURE_NAMES
from service.policies.errors import PolicyLoadError
from service.policies.registry import load_registry
from service.policies.training_summary import (
    SUMMARY_FILE,
    TrainingInputs,
    featurise,
    load_summary,
    summarise,
    write_summary,
)
from tests.checks.drift_fixtures import POLICIES_DIR

ONE = ("x",)


def _rule(n_features: int = 1, threshold: float = 1.0, window: int = 1) -> FlagRule:
    return FlagRule(window, 0.05, np.full(n_features, 0.1), threshold, 100)


def test_psi_matches_the_hand_computed_value() -> None:
    # (0.25 - 0.5) ln(0.25/0.5) + (0.75 - 0.5) ln(0.75/0.5)
    want = -0.25 * math.log(0.5) + 0.25 * math.log(1.5)
    assert psi(np.array([0.5, 0.5]), np.array([0.25, 0.75])) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.2747, abs=1e-4)
    assert psi(np.array([0.2, 0.3, 0.5]), np.array([0.2, 0.3, 0.5])) == 0.0


def test_psi_floors_empty_bins_instead_of_diverging() -> None:
    got = psi(np.array([1.0, 0.0]), np.array([0.9, 0.1]))
    want = (0.9 - 1.0) * math.log(0.9) + (0.1 - PSI_FLOOR) * math.log(0.1 / PSI_FLOOR)
    assert got == pytest.approx(want, rel=1e-12)


def test_reference_psi_bins_are_deciles_and_outer_bins_hold_no_training_mass() -> None:
    x = np.arange(1000, dtype=np.float64)[:, None]
    ref = build_reference(x, ONE, (), ())
    p = ref.proportions[0]
    assert p[0] == 0.0 and p[-1] == 0.0  # below min, above max
    assert np.allclose(p[1:-1], 0.1, atol=0.002)
    assert np.allclose(ref.psi(ref.psi_counts(x)), 0.0)
    above = np.concatenate([x[:900], np.full((100, 1), 5000.0)])  # 10% beyond the max
    got = ref.psi(ref.psi_counts(above))[0]
    bins = np.searchsorted(ref.edges[0], above[:, 0], "right")
    want = psi(p, np.bincount(bins, minlength=len(p)) / 1000)
    assert got == pytest.approx(want) and got > 0.5


def test_ks_on_the_grid_brackets_scipy_two_sample_statistic() -> None:
    rng = np.random.default_rng(3)
    reference = rng.normal(size=101)
    ref = build_reference(reference[:, None], ONE, (), (), grid_size=101)  # grid = every value
    for shift in (0.0, 0.3, 1.0):
        live = rng.normal(shift, 1.0, size=400)
        d = ref.ks(ref.grid_counts(live[:, None]))[0]
        scipy_d = stats.ks_2samp(live, reference).statistic
        assert scipy_d - 1 / 101 - 1e-12 <= d <= scipy_d + 1e-12


def test_ks_pvalue_is_scipys_one_sample_test_against_an_exact_cdf() -> None:
    rng = np.random.default_rng(5)
    live = rng.uniform(size=300) ** 1.2
    r = stats.kstest(live, "uniform")
    assert ks_pvalue(float(r.statistic), 300) == pytest.approx(r.pvalue, rel=1e-6)
    assert math.isnan(ks_pvalue(0.1, 0))


def test_build_reference_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match=r"`x` must have shape \(n > 0, 1\)"):
        build_reference(np.zeros((0, 1)), ONE, (), ())
    with pytest.raises(ValueError, match="`x` must be finite"):
        build_reference(np.array([[np.nan]]), ONE, (), ())


def test_novel_categories_flag_the_window_and_every_decision_on_them() -> None:
    x = np.linspace(0, 1, 50)[:, None]
    ref = build_reference(x, ONE, {"K80", "V100"}, {"train"})
    acc = WindowAccumulator(ref, _rule(threshold=1e9), window_requests=3)
    offsets = np.array([0, 2, 4, 6])
    cats = [
        Categories(frozenset({"K80"}), "train", ""),
        Categories(frozenset({"P100", "V100"}), "train", ""),  # unseen class
        Categories(frozenset({"V100"}), "infer", ""),  # unseen kind
    ]
    rows = np.full((6, 1), 0.5)
    [w] = acc.feed(rows, offsets, cats, chosen=np.array([0, 1, -1]))
    assert w.flagged and w.unseen_hardware == ("P100",) and w.unseen_kinds == ("infer",)
    assert (w.decisions, w.out_of_support_decisions, w.out_of_support_rows) == (3, 2, 4)
    assert w.statistic < w.threshold  # flagged by novelty alone


def test_unseen_qos_classes_and_unknown_kinds_flag_like_unseen_hardware() -> None:
    """Open vocabularies (issue 22): an unknown kind or QoS class is data, flagged as unseen."""
    x = np.linspace(0, 1, 50)[:, None]
    ref = build_reference(x, ONE, {"K80"}, {"train"}, qos_classes={"", "LS"})
    acc = WindowAccumulator(ref, _rule(threshold=1e9), window_requests=4)
    cats = [
        Categories(frozenset({"K80"}), "train", ""),
        Categories(frozenset({"K80"}), "train", "LS"),
        Categories(frozenset({"K80"}), "train", "gold"),  # unseen QoS
        Categories(frozenset({"K80"}), "notebook", "LS"),  # unseen (and unknown) kind
    ]
    [w] = acc.feed(np.full((4, 1), 0.5), np.arange(5), cats, chosen=np.array([0, 0, 0, 0]))
    assert w.flagged and w.unseen_qos == ("gold",) and w.unseen_kinds == ("notebook",)
    assert w.unseen_hardware == ()
    assert (w.out_of_support_decisions, w.out_of_support_rows) == (2, 2)
    # the same window without the two novel requests is not flagged
    [w] = acc.feed(np.full((4, 1), 0.5), np.arange(5), [cats[0], cats[1]] * 2)
    assert not w.flagged and w.unseen_qos == ()
    # a reference without recorded QoS classes (a v1 summary) does not check QoS
    old = build_reference(x, ONE, {"K80"}, {"train"})
    assert old.qos_classes is None and not old.is_novel(cats[2])
    # unset QoS where training always had one is flagged too, and named
    strict = build_reference(x, ONE, {"K80"}, {"train"}, qos_classes={"LS"})
    assert strict.unseen(cats[0]).qos == "(unset)"


def test_unseen_model_families_flag_and_are_named_when_the_reference_knows_them() -> None:
    """Issue 23: a manifest's ``model_families`` make drift flag a family it never saw."""
    x = np.linspace(0, 1, 50)[:, None]
    plain = build_reference(x, ONE, {"K80"}, {"train"})
    ref = with_model_families(plain, ["ResNet-50", "LM (batch size 20)"])
    assert ref.model_families == {"ResNet-50", "LM"}
    assert model_family_of("ResNet-50 (batch size 64)") == "ResNet-50"
    acc = WindowAccumulator(ref, _rule(threshold=1e9), window_requests=4)
    cats = [
        Categories(frozenset({"K80"}), "train", "", "ResNet-50"),
        Categories(frozenset({"K80"}), "train", "", "LM"),  # a new batch size is no new family
        Categories(frozenset({"K80"}), "train", "", "Llama-3-8B"),  # unseen family
        Categories(frozenset({"K80"}), "train", "", "GPT-2"),  # unseen family
    ]
    [w] = acc.feed(np.full((4, 1), 0.5), np.arange(5), cats, chosen=np.array([0, 0, 0, 0]))
    assert w.flagged and w.unseen_families == ("GPT-2", "Llama-3-8B")
    assert (w.out_of_support_decisions, w.out_of_support_rows) == (2, 2)
    assert w.statistic < w.threshold  # flagged by novelty alone
    [w] = acc.feed(np.full((4, 1), 0.5), np.arange(5), [cats[0], cats[1]] * 2)
    assert not w.flagged and w.unseen_families == ()
    # without a manifest list families are not checked, as before
    assert with_model_families(plain, []).model_families is None
    assert not plain.is_novel(cats[2])


def test_out_of_support_decisions_follow_the_chosen_row() -> None:
    x = np.linspace(0, 1, 50)[:, None]
    ref = build_reference(x, ONE, {"K80"}, {"train"})
    acc = WindowAccumulator(ref, _rule(threshold=1e9), window_requests=4)
    cats = [Categories(frozenset({"K80"}), "train", "")] * 4
    rows = np.array([[0.5], [2.0], [0.5], [2.0], [0.5], [-1.0], [0.2]])
    offsets = np.array([0, 2, 4, 5, 7])
    # request 0 chose its in-range row; 1 chose its out-of-range row;
    # 2 deferred with only in-range rows; 3 deferred with an out-of-range row
    [w] = acc.feed(rows, offsets, cats, chosen=np.array([0, 1, -1, -1]))
    assert (w.out_of_support_rows, w.out_of_support_decisions) == (3, 2)
    assert not w.flagged


def test_windows_split_batches_exactly_at_the_boundary() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 2))
    ref = build_reference(x, ("a", "b"), {"K80"}, {"train"})
    acc = WindowAccumulator(ref, _rule(2), window_requests=7)
    live = rng.normal(0.2, 1.0, size=(60, 2))  # 30 requests of 2 rows
    cats = [Categories(frozenset({"K80"}), "train", "")] * 30
    closed = []
    for lo, hi in ((0, 5), (5, 19), (19, 30)):  # batches straddle window ends
        offsets = np.arange(lo, hi + 1) * 2 - lo * 2
        closed += acc.feed(live[2 * lo : 2 * hi], offsets, cats[lo:hi])
    assert [w.n_requests for w in closed] == [7, 7, 7, 7]
    assert acc.n_requests == 2
    second = live[14:28]
    assert np.allclose(closed[1].psi, ref.psi(ref.psi_counts(second)))
    assert np.allclose(closed[1].ks, ref.ks(ref.grid_counts(second)))


def test_calibrated_rule_controls_false_flags_and_catches_a_shift() -> None:
    rng = np.random.default_rng(11)
    n_req, f = 4000, 4
    x = rng.normal(size=(n_req, f))  # one row per request, independent requests
    offsets = np.arange(n_req + 1)
    ref = build_reference(x, tuple("abcd"), (), ())
    rule = calibrate(ref, x, offsets, offsets, 200, alpha=0.05, n_windows=400, seed=0)
    assert rule.threshold > 1.0 and np.all(rule.scale >= 0.005)

    def rate(shift: float) -> float:
        flags = []
        for _ in range(200):
            live = rng.normal(size=(200, f))
            live[:, 2] += shift
            flags.append(rule.statistic(ref.psi(ref.psi_counts(live))) > rule.threshold)
        return float(np.mean(flags))

    null = rate(0.0)
    assert null <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)  # in-sample bins: a little under alpha
    assert rate(0.6) >= 0.95


def test_select_rule_takes_the_largest_window_not_above_the_setting() -> None:
    rules = [_rule(window=w) for w in (250, 1000, 4000)]
    assert select_rule(rules, 3999).window_requests == 1000
    assert select_rule(rules, 4000).window_requests == 4000
    with pytest.raises(ValueError, match="`window_requests` must be at least 250"):
        select_rule(rules, 100)


def test_shipped_summaries_load_with_the_running_feature_function() -> None:
    # fails when the feature hash moved: rerun `python -m service.learning.training_summaries`
    for name in ("gavel-scorer", "iwr-scorer", "lcb-planner"):
        s = load_summary(POLICIES_DIR / name)
        assert s is not None, name
        assert s.feature_hash == DEFAULT_FEATURES.definition_hash
        assert s.reference.names == FEATURE_NAMES
        assert {r.window_requests for r in s.rules} >= {250, 4000}
        for r in s.rules:  # every one trained on simulated episodes: an arrival process
            assert r.arrival_center is not None and r.arrival_threshold is not None
        # the window statistic's noise shrinks as windows grow
        bands = [r.arrival_threshold for r in sorted(s.rules, key=lambda r: r.window_requests)]
        assert all(b is not None and b > 0 for b in bands)
        assert bands == sorted(bands, reverse=True), bands
    for baseline in ("gavel-throughput", "learned-outcome"):  # predictors: no summary
        assert load_summary(POLICIES_DIR / baseline) is None


def test_a_summary_for_another_feature_definition_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "iwr-scorer"
    folder.mkdir()
    data = json.loads((POLICIES_DIR / "iwr-scorer" / SUMMARY_FILE).read_text())
    data["feature_hash"] = "0" * 64
    (folder / SUMMARY_FILE).write_text(json.dumps(data))
    with pytest.raises(PolicyLoadError, match=r"`feature_hash` 000000000000 differs") as info:
        load_summary(folder)
    assert "python -m service.learning.training_summaries" in info.value.problem
    (folder / SUMMARY_FILE).write_text(json.dumps({**data, "schema": "v0"}))
    with pytest.raises(PolicyLoadError, match="`schema` must be"):
        load_summary(folder)


def test_shipped_scorer_summaries_are_what_the_generator_computes(tmp_path: Path) -> None:
    """The reference part recomputed from the scorers' training episodes equals the files
    (`gavel-scorer` and `iwr-scorer` were fitted on the same episodes: one reference)."""
    from service.environment import simulated_episodes

    trained = simulated_episodes("train", 0, range(120))
    x, offsets, starts, cats = featurise([g for g, _ in trained])
    inputs = TrainingInputs("s", x, offsets, starts, cats, {})
    mine = summarise("gavel-scorer", inputs, window_sizes=(250,), n_windows=50)
    a = mine.reference
    assert a.n_rows == len(x) and len(offsets) - 1 == sum(len(g) for g, _ in trained)
    for name in ("gavel-scorer", "iwr-scorer"):
        shipped = load_summary(POLICIES_DIR / name)
        assert shipped is not None
        b = shipped.reference
        assert a.n_rows == b.n_rows and a.hardware_classes == b.hardware_classes, name
        for f in range(a.n_features):
            assert np.array_equal(a.edges[f], b.edges[f]) and np.allclose(
                a.proportions[f], b.proportions[f]
            )
            assert np.array_equal(a.grid[f], b.grid[f])
    again = summarise("gavel-scorer", inputs, window_sizes=(250,), n_windows=50)
    p1, p2 = write_summary(mine, tmp_path), (tmp_path / "again")
    p2.mkdir()
    assert p1.read_bytes() == write_summary(again, p2).read_bytes()  # seeded: same bytes
    assert request_categories(trained[0][0][0])[1] == "train"


def test_requests_a_policy_did_not_decide_on_count_no_decision() -> None:
    ref = build_reference(np.linspace(0, 1, 50)[:, None], ONE, {"K80"}, {"train"})
    acc = WindowAccumulator(ref, _rule(threshold=1e9), window_requests=2)
    cats = [Categories(frozenset({"K80"}), "train", "")] * 2
    rows = np.array([[2.0], [2.0]])  # both out of range
    [w] = acc.feed(rows, np.array([0, 1, 2]), cats, chosen=np.array([NO_DECISION, 0]))
    assert (w.decisions, w.out_of_support_decisions, w.out_of_support_rows) == (1, 1, 2)


def test_registry_keeps_the_policy_but_refuses_its_stale_summary(tmp_path: Path) -> None:
    for name in ("iwr-scorer", "learned-outcome"):  # the scorer and the predictor it names
        shutil.copytree(POLICIES_DIR / name, tmp_path / name)
    path = tmp_path / "iwr-scorer" / SUMMARY_FILE
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "feature_hash": "f" * 64}))
    registry = load_registry(tmp_path, include_baselines=False)
    assert "iwr-scorer" in registry.policies
    assert "iwr-scorer" not in registry.training_summaries
    assert "regenerate it" in registry.summaries_refused["iwr-scorer"].problem


# --- the arrival check ----------------------------------------------------------------


def test_arrival_statistic_is_the_log_upper_quartile_of_positive_gaps() -> None:
    # gaps 10, 10, 20: numpy's linear upper quartile is 15
    assert arrival_statistic(np.array([0.0, 10.0, 20.0, 40.0])) == pytest.approx(math.log(15.0))
    assert gap_statistic(np.array([4.0])) == pytest.approx(math.log(4.0))
    assert math.isnan(arrival_statistic(np.array([5.0, 5.0, 5.0])))  # no positive gap
    assert math.isnan(arrival_statistic(np.array([7.0])))


def test_arrival_gaps_drop_ties_out_of_order_times_and_clock_resets() -> None:
    # an episode, a tie (a re-mirror), a clock reset to 0, another episode with a tie
    times = np.array([0.0, 10.0, 10.0, 30.0, 0.0, 5.0, 5.0, 25.0])
    assert positive_gaps(times).tolist() == [10.0, 20.0, 5.0, 20.0]
    # out of order: 12 after 20 is dropped, the gap from 12 to 30 counts
    assert positive_gaps(np.array([0.0, 20.0, 12.0, 30.0])).tolist() == [20.0, 18.0]
    assert positive_gaps(np.array([3.0, 4.0]), after=1.0).tolist() == [2.0, 1.0]
    assert arrival_statistic(times) == pytest.approx(math.log(20.0))  # quartile of 5,10,20,20


def test_windows_see_arrival_gaps_within_the_window_across_batches() -> None:
    ref = build_reference(np.linspace(0, 1, 50)[:, None], ONE, {"K80"}, {"train"})
    rule = FlagRule(
        4, 0.05, np.full(1, 0.1), 1e9, 100, arrival_center=math.log(10.0), arrival_threshold=0.5
    )
    acc = WindowAccumulator(ref, rule, window_requests=4)
    cats = [Categories(frozenset({"K80"}), "train", "")] * 3
    times = np.array([0.0, 10.0, 20.0, 30.0, 1000.0, 1001.0, 1001.0, 1002.0, 1003.0])
    rows = np.full((9, 1), 0.5)
    closed = []
    for lo, hi in ((0, 3), (3, 6), (6, 9)):  # batches straddle the window end
        closed += acc.feed(rows[lo:hi], np.arange(hi - lo + 1), cats, times=times[lo:hi])
    assert len(closed) == 2
    first, second = closed
    # the 970 s gap from 30 to 1000 crosses windows and belongs to neither
    assert first.arrival == pytest.approx(arrival_statistic(times[:4])) == math.log(10.0)
    assert second.arrival == pytest.approx(arrival_statistic(times[4:8])) == 0.0
    assert first.arrival_shift == pytest.approx(0.0) and not first.flagged
    assert second.arrival_shift == pytest.approx(-math.log(10.0))
    assert second.arrival_flagged and second.flagged and second.statistic < 1e9
    with pytest.raises(ValueError, match="`times` must have one time per request"):
        acc.feed(rows[:2], np.arange(3), cats[:2], times=times[:1])


def test_a_rule_without_an_arrival_reference_never_flags_on_arrivals() -> None:
    rule = _rule()
    assert math.isnan(rule.arrival_shift(-10.0)) and not rule.arrival_flagged(-10.0)
    timed = FlagRule(1, 0.05, np.full(1, 0.1), 1.0, 100, 2.0, 0.5)
    assert timed.arrival_flagged(1.4) and timed.arrival_flagged(2.6)  # two-sided
    assert not timed.arrival_flagged(1.6) and not timed.arrival_flagged(math.nan)


def test_calibrated_arrival_check_controls_false_flags_and_catches_a_surge() -> None:
    """Episodes of Poisson arrivals, each restarting its clock: the calibrated centre is the
    known upper quartile of exponential gaps, mean * ln 4; fresh episodes are rarely flagged,
    arrivals 4.69x faster (the simulator's surge factor) always."""
    rng = np.random.default_rng(5)
    n_ep, per_ep, mean_gap = 100, 50, 60.0

    def episodes(n: int, gap: float) -> np.ndarray:
        return np.cumsum(rng.exponential(gap, size=(n, per_ep)), axis=1).ravel()  # resets

    times = episodes(n_ep, mean_gap)
    starts = np.arange(0, n_ep * per_ep + 1, per_ep)
    feature_rule = _rule(threshold=1e9, window=500)
    assert feature_rule.arrival_center is None
    rule = calibrate_arrival(feature_rule, times, starts, n_windows=400, seed=0)
    assert rule.threshold == feature_rule.threshold and rule.alpha == 0.05
    assert rule.arrival_center is not None and rule.arrival_threshold is not None
    assert rule.arrival_center == pytest.approx(math.log(mean_gap * math.log(4.0)), abs=0.05)

    def rate(gap: float) -> float:
        return float(
            np.mean(
                [rule.arrival_flagged(arrival_statistic(episodes(10, gap))) for _ in range(200)]
            )
        )

    assert rate(mean_gap) <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)
    assert rate(mean_gap / 4.69) == 1.0
    with pytest.raises(ValueError, match="`group_starts` must end at the number of request"):
        calibrate_arrival(feature_rule, times[:-1], starts)
