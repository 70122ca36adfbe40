"""Policy learning from simulated logs, pessimistic planning, and reproducible comparison.

Modules, by whether they may import the build-time ML stack:

    logs          simulated production logs -> training rows          (runtime)
    quality       pinball loss, interval coverage, group baselines    (runtime)
    stats         intervals over seeds                                (runtime)
    fit           quantile predictor + importance-weighted scorer     (build time: scikit-learn)
    train         fit, export to ONNX, write manifests, verify        (build time: skl2onnx)
    compare       every candidate on every scenario, both truths      (runtime)
    run_manifest  what a compare/sweep run depended on, for reruns    (runtime)
    shifts, sweep value vs production as a shift grows                (runtime)
    plots         sweep figures                                       (runtime: matplotlib)
    training_summaries  regenerate policies/*/training_summary.json  (build time)

Only `fit` and `train` import scikit-learn, skl2onnx or onnx, and importing
this package imports neither; a test reads every module's imports to keep it
so. What the service loads is the committed ONNX in ``policies/``; nothing
here runs in the service.
"""
