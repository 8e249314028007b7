"""The validation stage (node: agents/nodes/validator.py): the reference run and the token/tensor
comparison, msProbe-style numerics, and performance evidence from the decode profile."""
