"""Studies built on the trainer: what they measure and how they report it.

* `compute`: the compute study, the real trainer on the replayed recipe
  benchmark, per arm and seed;
* `controlled`: the controlled study, GRPO on a simulated environment with a
  known ground truth, jitted and vmapped over seeds;
* `oracle`: the replay-oracle step hook (`oracle/*`: fed rewards vs the truth);
* `report`: study tables, plots and the README section;
* `smoothing`: the one moving average the studies use.

A new study is a module here plus an entry point in `experiments/`.
"""
