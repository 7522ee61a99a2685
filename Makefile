# The README's commands. `make run` / `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run study study-realsweep study-paired regime regime-controlled controlled embodied test lint bench engine sandbox-image sandbox-image-cuda trainer-image trainer-image-docker fixtures clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,ray,embodied]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m experiments.train --config=experiments/configs/tiny_cpu.py --workdir=outputs/tiny_cpu

study: $(STAMP)
	$(PY) -m experiments.study_compute --config=experiments/configs/study_compute.py --workdir=outputs/study_compute --readme=README.md --docs=docs/compute_study.md

# The best real baseline, picked on seeds the study does not report (table.md names it),
# then the exact, paired comparison on 10 seeds: make study-paired BEST_REAL=<its label>.
study-realsweep: $(STAMP)
	$(PY) -m experiments.study_compute --config=experiments/configs/study_compute.py:realsweep --workdir=outputs/study_compute_realsweep --docs=docs/compute_study.md

study-paired: $(STAMP)
	$(PY) -m experiments.study_compute --config=experiments/configs/study_compute.py:paired --workdir=outputs/study_compute_paired --config.study.best_real=$(BEST_REAL) --docs=docs/compute_study.md

# The regime map (world-model quality x execution cost x model size) against the real
# sweep's pick (run study-realsweep first): `wmrl`, then `wmrl_ppi` added with --extend.
# BEST_REAL=<label> names the pick instead (e.g. real_g5_lr0.01, the pick docs/compute_study.md records).
regime: $(STAMP)
	$(PY) -m experiments.regime --config=experiments/configs/regime.py --workdir=outputs/regime $(if $(BEST_REAL),--config.study.best_real=$(BEST_REAL))
	$(PY) -m experiments.regime --config=experiments/configs/regime.py:ppi --workdir=outputs/regime --extend --readme=README.md --docs=docs/regime.md $(if $(BEST_REAL),--config.study.best_real=$(BEST_REAL))

# The same map in the controlled study: novel programs, truth known (minutes).
regime-controlled: $(STAMP)
	$(PY) -m experiments.controlled_regime --config=experiments/configs/controlled.py:regime --workdir=outputs/regime_controlled --readme=README.md --docs=docs/regime.md

main-seeds: $(STAMP)
	$(PY) -m experiments.main_job --config=experiments/configs/main_job.py --config.train.executor.kind=replay --workdir=outputs/main_job --readme=README.md --docs=docs/main_job.md

controlled: $(STAMP)
	$(PY) -m experiments.controlled --config=experiments/configs/controlled.py --workdir=outputs/controlled --readme=README.md --docs=docs/controlled_study.md

embodied: $(STAMP)
	$(PY) -m experiments.study_embodied --config=experiments/configs/embodied.py --workdir=outputs/embodied --readme=README.md --docs=docs/embodied.md

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(STAMP) lint
	$(PY) -m pytest -n 2 -q --durations=30

bench: $(STAMP)
	$(PY) -m benchmarks.isotonic --json outputs/bench/isotonic.json
	$(PY) -m benchmarks.fusion --json outputs/bench/fusion.json
	$(PY) -m benchmarks.sandbox --json outputs/bench/sandbox.json
	$(PY) -m benchmarks.forward --json outputs/bench/forward.json
	$(PY) -m benchmarks.sampler --json outputs/bench/sampler.json
	$(PY) -m benchmarks.train_step --preset tiny --json outputs/bench/train_step.json
	$(PY) -m benchmarks.scaleout --json outputs/bench/scaleout.json
	$(PY) -m benchmarks.grpo_step --skip tunix --trials 1 --json outputs/bench/grpo_step.json
	$(PY) -m benchmarks.overlap --json outputs/bench/overlap.json
	$(PY) -m benchmarks.exact --json outputs/bench/exact.json

# Rebuilds the committed tiny checkpoints and their reference outputs (needs
# `pip install torch==2.13.0`; tests themselves never need torch).
fixtures: $(STAMP)
	$(PY) -m wmrl_jax.models.fixtures --out tests/models/fixtures

engine:
	launch/docker_engine.sh start

sandbox-image: $(STAMP)
	$(PY) -m wmrl_jax.sandbox.image

clean:
	rm -rf $(VENV) outputs .pytest_cache .hypothesis

sandbox-image-cuda: $(STAMP)
	$(PY) -m wmrl_jax.sandbox.image --variant=cuda

# The Kubernetes launch's image (wmrl-jax:latest), offline (Debian + PyPI), like the
# sandbox image; `make trainer-image EXTRAS=ray` for CPU-only nodes.
EXTRAS ?= ray,cuda12
trainer-image: $(STAMP)
	$(PY) -m wmrl_jax.sandbox.trainer_image --extras=$(EXTRAS)

# The same image with `docker build`, where a registry is reachable.
trainer-image-docker:
	docker build -f launch/trainer.Dockerfile --build-arg EXTRAS=$(EXTRAS) -t wmrl-jax:latest .
