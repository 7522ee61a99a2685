"""WMRL for control policies: Gymnasium MuJoCo tasks with a learned progress model as WM.

Modules: `tasks` (which environments, what success is), `envs` (N episode
slots behind one protocol), `rollout` (full, truncated and replicate
episodes), `policy` (a Gaussian MLP), `grpo_step` (the GRPO update),
`progress` (the world model), `arms` (what each arm simulates), `train` (one
run), `study` (all runs, analysis, report) and `libero` (the adapter for
LIBERO users). Needs the ``embodied`` extra (``gymnasium[mujoco]``).
"""
