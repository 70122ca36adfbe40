"""The evaluator: the loop that evaluates protocols, its leader lease, the
monitors and the candidate gate."""
