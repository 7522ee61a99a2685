"""Install wmrl_jax: `pip install -e .[dev]` (CPU) or `pip install -e .[cuda12]` (GPU)."""

import setuptools

_DEV = [
    "pytest>=8",
    "pytest-xdist>=3",
    "hypothesis>=6.100",
    "scikit-learn>=1.4",
    "scipy>=1.12",
    "jaxopt>=0.8",
    "nbclient>=0.10",
    "ipykernel>=6",
    "ruff>=0.6",
    # Tests read prompts as a Markdown parser would (the prompt-injection tests).
    "markdown-it-py>=3",
]

setuptools.setup(
    name="wmrl_jax",
    version="0.1.0",
    description="World Model RL (WMRL) for automatic-research agents, in JAX.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["wmrl_jax", "wmrl_jax.*"]),
    # The native kernels' source (compiled on first use) and the recipe benchmark table.
    package_data={"wmrl_jax": ["core/_native/*.cc", "envs/data/*.npz"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.5",
        "flax>=0.10",
        "optax>=0.2.4",
        "orbax-checkpoint>=0.11",
        "chex>=0.1.88",
        "numpy>=1.26",
        "ml_dtypes>=0.4",
        "scikit-learn>=1.4",  # the built-in task suite and its reference solutions
        "scipy>=1.12",  # the studies' intervals (t quantiles), the boards' statistics
        "ml_collections>=1.0",
        "absl-py>=2.1",
        "transformers>=5.24",  # qwen3_5 (Qwen3.5) support
        "jinja2>=3.1",  # chat templates (transformers does not require it)
        "docker>=7.1",
        "tensorboardX>=2.6",  # TensorBoard event files without TensorFlow
        "tqdm>=4.60",
        "pyyaml>=6.0",  # MLE-bench competition configs
        "matplotlib>=3.8",  # run and study plots
    ],
    extras_require={
        "cuda12": ["jax[cuda12]>=0.5"],
        "dev": _DEV,
        # Executions over a Ray cluster (`wmrl_jax.sandbox.ray_executor`).
        "ray": ["ray[default]>=2.40"],
        # WMRL for control policies on MuJoCo tasks (`wmrl_jax.embodied`).
        "embodied": ["gymnasium[mujoco]>=1.0"],
    },
)
