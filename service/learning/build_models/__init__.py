"""Build-time only: fit, evaluate and export the shipped models.

Run ``python -m service.learning.build_models``. This package is the only
place scikit-learn and skl2onnx are imported; the service loads the committed
ONNX artifacts and never retrains. Importing the package itself pulls in
nothing heavy, so tests can use `gavel` without scikit-learn.
"""
