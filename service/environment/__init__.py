"""The heterogeneous-cluster simulator: Gymnasium API, real measured data, ground truths.

Layers, inner to outer (each imports only those above it)::

    data         Gavel throughputs, Philly-derived traces, Philly surge, Alibaba shapes
    scenario     YAML conditions (scenarios/*.yaml): training + held-out
    colocation   co-located rates: Gavel's pairs, the model where one is missing
    partitions   MIG-style partition classes (published profiles)
    world        a scenario bound to the data: servers, devices, rates, job source
    sim_state    keyed randomness, a request's options, the mutable state
    sharing      share jobs on devices: free share / memory, a share job's options
    sim          the discrete-event core: options, placement, sharing, forks
    emulator     the production (logging) policy; reference: simple baselines
    episode      seeding, the contract view (MirrorRequest/Outcome), drivers
    recording    recorded production runs: requests, outcomes, fork points
    truth        per-decision counterfactual and on-policy truths
    dataset      logged datasets as arrays, vectorised replications
    env          the Gymnasium environment (``Understudy/Cluster-v0``)
    reproduction, report   the acceptance checks and figures

Only `service.contract` and `service.policies.base` are imported from the
project. See docs/simulator.md for the transition assumptions.
"""

from service.environment.data import (
    DATA_ENV_VAR,
    SharedDataMissing,
    ThroughputTable,
    data_dir,
    load_throughputs,
    load_trace,
)
from service.environment.dataset import ContextPool, LoggedDataset, Replicates, Truth, build_pool
from service.environment.emulator import ProductionEmulator, packing_scores
from service.environment.env import ENV_ID, ClusterEnv, register_envs
from service.environment.episode import (
    OUTCOME_FIELDS,
    JobOutcomes,
    contract_request,
    job_outcomes,
    new_episode,
    run_policy,
    run_production,
)
from service.environment.recording import (
    EpisodeLog,
    LoggedDecision,
    log_episode,
    simulated_episodes,
)
from service.environment.reference import LeastLoaded, RandomFeasible, ThroughputAware
from service.environment.scenario import (
    EmulatorMode,
    NodeGroup,
    ProductionConfig,
    Scenario,
    load_scenario,
    scenario_names,
)
from service.environment.sim import Randomness, Simulator
from service.environment.truth import Estimate, OnPolicyResult, counterfactual_outcomes, on_policy
from service.environment.world import EpisodeJobs, World

__all__ = [
    "DATA_ENV_VAR",
    "ENV_ID",
    "OUTCOME_FIELDS",
    "ClusterEnv",
    "ContextPool",
    "EmulatorMode",
    "EpisodeJobs",
    "EpisodeLog",
    "Estimate",
    "JobOutcomes",
    "LeastLoaded",
    "LoggedDataset",
    "LoggedDecision",
    "NodeGroup",
    "OnPolicyResult",
    "ProductionConfig",
    "ProductionEmulator",
    "RandomFeasible",
    "Randomness",
    "Replicates",
    "Scenario",
    "SharedDataMissing",
    "Simulator",
    "ThroughputAware",
    "ThroughputTable",
    "Truth",
    "World",
    "build_pool",
    "contract_request",
    "counterfactual_outcomes",
    "data_dir",
    "job_outcomes",
    "load_scenario",
    "load_throughputs",
    "load_trace",
    "log_episode",
    "new_episode",
    "on_policy",
    "packing_scores",
    "register_envs",
    "run_policy",
    "run_production",
    "scenario_names",
    "simulated_episodes",
]
