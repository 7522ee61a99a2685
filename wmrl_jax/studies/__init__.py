"""Studies built on the trainer: what they measure and how they report it.

* `analysis`: the one analysis every study uses: reaching a target
  (interpolated), paired differences with an interval and an equivalence
  verdict, and the command shape of the entry points;
* `compute`: the compute study, the real trainer on the replayed recipe
  benchmark, per arm and seed (`runs`: its runs per seed; `compute_paired`:
  its exact, paired analysis; `compute_report`: its command and report);
* `exact`: the policy's exact expected values on the replay benchmark;
* `controlled`: the controlled study, GRPO on a simulated environment with a
  known ground truth, jitted and vmapped over seeds (`controlled_report`: its
  command and report);
* `oracle`: the replay-oracle step hook (`oracle/*`: fed rewards vs the truth);
* `report`: study tables, plots and the README section;
* `smoothing`: the one moving average the studies use.

A new study is a module here, a `run` and a `render`, and an entry point in
`experiments/` that passes them to `analysis.command_main`.
"""
