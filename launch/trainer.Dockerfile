# The image of the Kubernetes launch (launch/k8s/*.yaml: wmrl-jax:latest), for
# machines that reach a registry (Docker Hub's python image, PyPI):
#
#   docker build -f launch/trainer.Dockerfile -t wmrl-jax:latest .
#   docker build -f launch/trainer.Dockerfile --build-arg EXTRAS=ray -t wmrl-jax:latest .  # CPU nodes
#
# Without a registry, `python -m wmrl_jax.sandbox.trainer_image` builds the same
# contents offline (Debian + PyPI only), as the sandbox image is built. Both:
# this checkout's package with its extras (`ray` for `ray start` and the
# executors, `cuda12` for JAX on the trainer's GPUs), and experiments/ in the
# working directory, so that `python -m experiments.train --config=experiments/...`
# runs as the manifests write it.
FROM python:3.11-slim-bookworm
ARG EXTRAS=ray,cuda12
ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1
COPY setup.py README.md /tmp/wmrl_jax-src/
COPY wmrl_jax /tmp/wmrl_jax-src/wmrl_jax
RUN pip install --no-cache-dir --disable-pip-version-check "/tmp/wmrl_jax-src[${EXTRAS}]" \
    && rm -rf /tmp/wmrl_jax-src
WORKDIR /opt/wmrl_jax
COPY experiments ./experiments
CMD ["python3"]
