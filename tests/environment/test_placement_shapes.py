"""Issue 23 acceptance, simulator half: placement shape as Pollux measured it.

For every model and GPU count of ``service/environment/data/placement_shapes.csv``
the simulator's throughput of a multi-server placement relative to its
reference (one server; the packed ``44`` at 8 GPUs) lies on the measured side
of 1, on every Gavel class. `shape_table` is the figure docs/simulator.md
reports (``python -m tests.environment.test_placement_shapes`` prints it).
The predictor half (``shapepred``) takes the same rows from
`PlacementShapes.measured_ratios`.
"""

from __future__ import annotations

import numpy as np
import pytest

from service.contract import check_feasibility, validate_request
from service.environment import NodeGroup, Randomness, Scenario, Simulator, contract_request
from service.environment.data import SCALE_FACTORS
from service.environment.reproduction import _jobs, bench_world
from service.environment.shapes import (
    POLLUX_MODELS,
    REPRESENTATIVE_JOB_TYPE,
    ShapeRatio,
    load_placement_shapes,
    model_for,
    shape_factor,
)
from service.environment.sharing import gang_factor
from service.environment.sim import DONE, RUNNING
from service.environment.world import World


def simulator_ratio(
    world: World, job_type: str, per_node: tuple[int, ...], reference: tuple[int, ...], c: int
) -> float:
    """The simulator's rate of `per_node` / that of `reference` (one domain, class `c`).

    GPU counts the simulator runs (Gavel's 1, 2, 4, 8) use the factor its rates
    apply (`sharing.gang_factor`, Gavel's extra loss included); 3 GPUs, which no trace
    job asks for, use `shape_factor` (what the simulator would apply).
    """
    k = sum(per_node)
    if k not in SCALE_FACTORS:
        return shape_factor(job_type, per_node) / shape_factor(job_type, reference)
    t, sf = world.table.type_index(job_type), SCALE_FACTORS.index(k)

    def rate(shape: tuple[int, ...]) -> float:
        return 1.0 if len(shape) == 1 else gang_factor(world, t, sf, c, shape, 1)

    return rate(per_node) / rate(reference)


def shape_table(world: World) -> list[tuple[ShapeRatio, float]]:
    """Each measured shape with the simulator's ratio on class 0 (representative type)."""
    out = []
    for r in load_placement_shapes().measured_ratios():
        job_type = REPRESENTATIVE_JOB_TYPE[r.model]
        out.append((r, simulator_ratio(world, job_type, r.per_node, r.reference, 0)))
    return out


@pytest.mark.parametrize("hardware", ["K80", "P100", "V100"])
def test_every_measured_shape_has_the_measured_direction_in_the_simulator(
    scenarios: dict[str, Scenario], hardware: str
) -> None:
    machine = {"K80": "MISC", "P100": "P100", "V100": "V100"}[hardware]
    world = bench_world(scenarios["train"], hardware, machine, 2, sigma=0.0)
    rows = load_placement_shapes().measured_ratios()
    assert {r.model for r in rows} == set(POLLUX_MODELS)
    assert {r.gpus for r in rows} == {2, 3, 4, 8}
    for model in POLLUX_MODELS:
        for job_type in world.table.job_types:  # every Gavel type of the model, not one
            if model_for(job_type) != model:
                continue
            for r in rows:
                if r.model != model:
                    continue
                sim = simulator_ratio(world, job_type, r.per_node, r.reference, 0)
                assert (sim - 1.0) * (r.measured - 1.0) > 0, (job_type, r, sim)


def test_spread_is_never_silently_as_fast_as_one_server() -> None:
    for job_type in (*REPRESENTATIVE_JOB_TYPE.values(), "A3C", "an unseen family"):
        for shape in [(1, 1), (2, 2), (1, 1, 1, 1), (4, 4), (2, 2, 2, 2), (6, 2), (1,) * 8]:
            for domains in (1, 2):
                f = shape_factor(job_type, shape, domains)
                assert 0 < f < 1, (job_type, shape, domains, f)
            assert shape_factor(job_type, shape, 2) < shape_factor(job_type, shape, 1)
        assert shape_factor(job_type, (8,)) == 1.0


def test_shape_factor_refuses_bad_arguments_naming_them() -> None:
    with pytest.raises(ValueError, match="per_node"):
        shape_factor("LM (batch size 20)", ())
    with pytest.raises(ValueError, match="per_node"):
        shape_factor("LM (batch size 20)", (2, 0))
    with pytest.raises(ValueError, match="localities"):
        shape_factor("LM (batch size 20)", (2, 2), 3)


def test_one_request_offers_one_server_packed_spread_and_cross_domain_gangs(
    scenarios: dict[str, Scenario],
) -> None:
    """Four empty 8-GPU V100 servers (two domains), one 8-GPU job: the shapes compete."""
    world = bench_world(scenarios["train"], "V100", "V100", 4, sigma=0.0)
    job_type = "Transformer (batch size 64)"
    jobs = _jobs(world, [job_type], [8], [1000.0])
    sim = Simulator(world, jobs, Randomness.draw((0,), 1, 0.0))
    j = sim.next_decision()
    assert j == 0
    opts = sim.options(j)
    assert opts.factor is not None and opts.localities is not None
    spans = np.diff(opts.offsets)
    shapes = {
        (tuple(int(t) for t in opts.take[opts.offsets[i] : opts.offsets[i + 1]]),
         int(opts.localities[i]))
        for i in range(opts.n)
    }  # fmt: skip
    assert ((8,), 1) in shapes  # one server
    assert ((4, 4), 1) in shapes and ((4, 4), 2) in shapes  # spread, inside / across domains
    assert ((2, 2, 2, 2), 2) in shapes  # four servers: the class has two domains of two
    assert opts.mask.all()
    request = contract_request(sim, j, "t")
    validate_request(request)  # gang_size covers every option
    assert request.workload.gang_size == int(spans.max()) == 4
    assert check_feasibility(request.state, request.workload, request.options).mask.all()
    assert len(set(request.options.option_ids)) == opts.n
    # run each option to the end in a fork: throughput ratio = the option's factor, one
    # server fastest, the cross-domain 4+4 slower than the same shape inside one domain
    rates = []
    for i in range(opts.n):
        fork = sim.fork()
        fork.apply(j, i)
        assert fork.state.status[j] == RUNNING
        while fork.next_decision() is not None:
            pass
        assert fork.state.status[j] == DONE
        rates.append(1000.0 / float(fork.state.finish[j] - fork.state.start[j]))
    rates_a = np.asarray(rates)
    one = int(np.flatnonzero(spans == 1)[0])
    np.testing.assert_allclose(rates_a / rates_a[one], opts.factor, rtol=1e-9)
    assert (np.delete(rates_a, np.flatnonzero(spans == 1)) < rates_a[one]).all()
    by_shape = {s: rates_a[i] for i, s in enumerate(
        (tuple(int(t) for t in opts.take[opts.offsets[i] : opts.offsets[i + 1]]),
         int(opts.localities[i])) for i in range(opts.n))}  # fmt: skip
    assert by_shape[((4, 4), 2)] < by_shape[((4, 4), 1)]
    assert by_shape[((4, 4), 1)] < by_shape[((2, 2, 2, 2), 2)] * 10  # finite, measured order


def test_a_known_class_gavel_never_measured_is_rated_by_the_rule_not_refused(
    scenarios: dict[str, Scenario],
) -> None:
    base = scenarios["train"]
    world = World(base.replace(nodes=(*base.nodes, NodeGroup("H100-SXM", 1, "V100"))))
    h100 = [c.name for c in world.classes].index("H100-SXM")
    v100 = [c.name for c in world.classes].index("V100")
    # min(989 / 125 TFLOP/s, 3350 / 900 GB/s) = 3.72 x V100's measured rate, every type
    np.testing.assert_allclose(world.class_scale[h100], 3350 / 900)
    both = np.isfinite(world.measured_cons[:, :, v100])
    np.testing.assert_allclose(
        world.cons_rate[:, :, h100][both], 3350 / 900 * world.measured_cons[:, :, v100][both]
    )
    assert world.allowed[:, :, h100].any()
    assert np.isnan(world.measured_cons[:, :, h100]).all()  # SLOs stay on Gavel's numbers
    demo = World(scenarios["demo"])  # a MIG partition has no rate: still masked
    part = [c.name for c in demo.classes].index("A100-80GB-3g.40gb")
    assert not demo.allowed[:, :, part].any()


def _print_docs_table() -> None:
    """The docs/simulator.md table: 2-4 GPUs row by row, 8 GPUs summarised per model."""
    from service.environment import load_scenario

    base = load_scenario("train")
    k80 = shape_table(bench_world(base, "K80", "MISC", 2, sigma=0.0))
    v100 = shape_table(bench_world(base, "V100", "V100", 2, sigma=0.0))
    print("| model | GPUs | shape | measured (T4) | simulator K80 | simulator V100 |")
    print("|---|---|---|---|---|---|")
    eight: dict[str, list[float]] = {}
    for (r, a), (_, b) in zip(k80, v100, strict=True):
        if r.gpus == 8:
            eight.setdefault(r.model, []).extend([abs(a - r.measured), abs(b - r.measured)])
            continue
        shape = "+".join(map(str, r.per_node))
        print(f"| {r.model} | {r.gpus} | {shape} | {r.measured:.3f} | {a:.3f} | {b:.3f} |")
    print()
    for m, errs in eight.items():
        print(f"- {m}: 8 GPUs, {len(errs) // 2} shapes vs 4+4, max |error| {max(errs):.3f}")


if __name__ == "__main__":
    _print_docs_table()
