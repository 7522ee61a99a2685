"""Environments: tasks, graders, leaderboards and the simulated environment.

`task`, `metrics`, `grading` and `suite` are numpy / scikit-learn only and never
import JAX model code; `simulated` is a pure-JAX toy environment.
"""
