"""Build the sandbox image offline: Debian root filesystem + pinned wheels.

    python -m wmrl_jax.sandbox.image            # build wmrl-sandbox:<version> unless it exists
    python -m wmrl_jax.sandbox.image --print    # print the tag and exit
    python -m wmrl_jax.sandbox.image --force    # rebuild
    python -m wmrl_jax.sandbox.image --variant=cuda  # wmrl-sandbox-cuda:<version>, JAX on CUDA 12
    python -m wmrl_jax.sandbox.image --variant=cuda --plan  # print the build steps, build nothing

No image registry is needed. `mmdebstrap --variant=essential` writes a minimal
Debian root filesystem with python3 and libstdc++6 into a temporary directory
(packages come from a Debian mirror); pip installs pinned binary wheels of
numpy, pandas, scipy and scikit-learn (and their dependencies) into it with
`--target`; the tree is packed with `tar` and loaded with `docker import`.
Needs root (mmdebstrap's root mode), `mmdebstrap`, `tar` and a reachable
engine. It takes one to three minutes (61 s on 2 cores with a near mirror), and
gives an image of about 550 MB. The tag carries a digest of the recipe, so a pin or the
suite that changes makes a new tag; an existing tag is never rebuilt unless `--force`.

The "cuda" variant adds JAX with its CUDA 12 plugin and NVIDIA's CUDA wheels
(cuBLAS, cuDNN, NCCL, ptxas, ...; the pins of `jax[cuda12]`): an image of about
6.1 GB, built in about 9 minutes on 2 cores. The GPU driver itself comes from
the host, mounted by the engine's GPU runtime when a container asks for GPUs
(`DockerExecutor(gpus=...)`). It builds on a machine without a GPU (only
wheels are fetched), where its programs run JAX on the CPU;
`launch/gpu_sandbox_check.sh` builds it on a GPU machine and checks that a
sandboxed program sees the GPU.
"""

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import wmrl_jax

log = logging.getLogger(__name__)

REPOSITORY = "wmrl-sandbox"
SUITE = "bookworm"
# The interpreter in the root filesystem: wheels are chosen for it, not the host.
PYTHON_VERSION = "3.11"
DEBIAN_PACKAGES = ("python3", "libstdc++6", "ca-certificates")
# Every wheel pinned, dependencies included, installed with --no-deps.
WHEELS = (
    "numpy==2.1.3",
    "pandas==2.2.3",
    "python-dateutil==2.9.0.post0",
    "pytz==2024.2",
    "tzdata==2024.2",
    "six==1.16.0",
    "scipy==1.14.1",
    "scikit-learn==1.5.2",
    "joblib==1.4.2",
    "threadpoolctl==3.5.0",
)
JAX_VERSION = "0.10.2"
# `jax[cuda12]` for JAX_VERSION on CPython 3.11 / x86_64, resolved by pip.
CUDA_WHEELS = (
    f"jax=={JAX_VERSION}",
    f"jaxlib=={JAX_VERSION}",
    f"jax-cuda12-plugin=={JAX_VERSION}",
    f"jax-cuda12-pjrt=={JAX_VERSION}",
    "ml_dtypes==0.7.0",
    "opt_einsum==3.4.0",
    "nvidia-cublas-cu12==12.9.3.13",
    "nvidia-cuda-cccl-cu12==12.9.27",
    "nvidia-cuda-cupti-cu12==12.8.90",
    "nvidia-cuda-nvcc-cu12==12.9.86",
    "nvidia-cuda-nvrtc-cu12==12.9.86",
    "nvidia-cuda-runtime-cu12==12.9.79",
    "nvidia-cudnn-cu12==9.28.0.42",
    "nvidia-cufft-cu12==11.4.1.4",
    "nvidia-cusolver-cu12==11.7.5.82",
    "nvidia-cusparse-cu12==12.5.10.65",
    "nvidia-nccl-cu12==2.32.3",
    "nvidia-nvjitlink-cu12==12.9.86",
    "nvidia-nvshmem-cu12==3.8.0",
)
SITE_PACKAGES = f"usr/local/lib/python{PYTHON_VERSION}/dist-packages"
# Mount points that must exist in the read-only root.
MOUNT_POINTS = ("work", "input", "tmp")
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    "ENV LANG=C.UTF-8",
    "WORKDIR /work",
    'CMD ["python3"]',
)
# The wheels' platform: manylinux2014 covers the CPU pins; jaxlib and the CUDA
# wheels are manylinux_2_27 and up, which the suite's glibc (2.36) runs.
CPU_PLATFORMS = ("manylinux2014_x86_64",)
CUDA_PLATFORMS = CPU_PLATFORMS + tuple(f"manylinux_2_{v}_x86_64" for v in range(17, 37))


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What goes into one image variant: Debian packages, pinned wheels, image settings."""

    variant: str
    repository: str
    debian_packages: tuple[str, ...]
    wheels: tuple[str, ...]
    platforms: tuple[str, ...]
    image_changes: tuple[str, ...]

    def version(self) -> str:
        """`<package version>-<digest of the recipe>`, e.g. `0.1.0-3f2a9c1e`."""
        # The CPU digest predates variants; kept as it was so that built images keep their tag.
        parts = [SUITE, PYTHON_VERSION, self.debian_packages, self.wheels, self.image_changes]
        if self.variant != "cpu":
            parts += [self.variant, self.platforms]
        digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:8]
        return f"{wmrl_jax.__version__}-{digest}"

    def tag(self) -> str:
        return f"{self.repository}:{self.version()}"


RECIPES = {
    "cpu": Recipe("cpu", REPOSITORY, DEBIAN_PACKAGES, WHEELS, CPU_PLATFORMS, IMAGE_CHANGES),
    "cuda": Recipe(
        "cuda",
        f"{REPOSITORY}-cuda",
        DEBIAN_PACKAGES,
        WHEELS + CUDA_WHEELS,
        CUDA_PLATFORMS,
        # Without it the GPU runtime mounts no compute libraries.
        IMAGE_CHANGES + ("ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility",),
    ),
}


def recipe(variant: str = "cpu") -> Recipe:
    """The recipe of `variant` ("cpu" or "cuda").

    Raises:
        ValueError: an unknown variant.
    """
    if variant not in RECIPES:
        raise ValueError(f"unknown image variant {variant!r}; known: {sorted(RECIPES)}")
    return RECIPES[variant]


def image_version(variant: str = "cpu") -> str:
    """`<package version>-<digest of the recipe>`, e.g. `0.1.0-3f2a9c1e`."""
    return recipe(variant).version()


def default_image(variant: str = "cpu") -> str:
    """The tag that `python -m wmrl_jax.sandbox.image [--variant=...]` builds."""
    return recipe(variant).tag()


def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def _run(cmd: list[str]) -> None:
    log.info("running: %s", " ".join(cmd))
    subprocess.run(cmd, check=True)


def build_steps(
    root: str, *, variant: str = "cpu", mirror: str | None = None, python: str | None = None
) -> list[list[str]]:
    """The commands that write `variant`'s root filesystem into `root`, in order.

    Example:
        >>> [step[0] for step in build_steps("/tmp/rootfs", python="python3")]
        ['mmdebstrap', 'python3']

    Args:
        root: the directory the tree goes into.
        variant: "cpu" or "cuda".
        mirror: a Debian mirror URL for mmdebstrap.
        python: the interpreter whose pip fetches the wheels (default: this one).
    """
    r = recipe(variant)
    debootstrap = [
        "mmdebstrap",
        "--quiet",
        "--variant=essential",
        "--include=" + ",".join(r.debian_packages),
        "--dpkgopt=path-exclude=/usr/share/{doc,man,info,locale}/*",
        "--dpkgopt=path-include=/usr/share/locale/locale.alias",
        SUITE,
        root,
    ]
    if mirror:
        debootstrap.append(mirror)
    platforms = [arg for platform in r.platforms for arg in ("--platform", platform)]
    pip = [
        python or sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        *platforms,
        "--target",
        os.path.join(root, SITE_PACKAGES),
        *r.wheels,
    ]
    return [debootstrap, pip]


def build_rootfs(root: str, *, variant: str = "cpu", mirror: str | None = None) -> None:
    """Writes the Debian tree and installs the pinned wheels into `root`."""
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    for step in build_steps(root, variant=variant, mirror=mirror):
        _run(step)
    for name in MOUNT_POINTS:
        os.makedirs(os.path.join(root, name), exist_ok=True)
    for cache in ("var/cache/apt", "var/lib/apt/lists"):
        shutil.rmtree(os.path.join(root, cache), ignore_errors=True)


def build_image(
    tag: str | None = None,
    *,
    variant: str = "cpu",
    force: bool = False,
    mirror: str | None = None,
    client=None,
) -> str:
    """Builds the sandbox image of `variant` unless `tag` exists already; returns the tag.

    Example:
        >>> tag = build_image()  # doctest: +SKIP
        >>> gpu_tag = build_image(variant="cuda")  # doctest: +SKIP
    """
    import docker

    r = recipe(variant)
    tag = tag or r.tag()
    client = client or docker.from_env()
    if not force and image_exists(client, tag):
        log.info("%s exists; nothing to build", tag)
        return tag
    repository, _, version = tag.rpartition(":")
    previous = client.images.get(tag).id if image_exists(client, tag) else None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wmrl-image-") as tmp:
        root = os.path.join(tmp, "rootfs")
        build_rootfs(root, variant=variant, mirror=mirror)
        archive = os.path.join(tmp, "rootfs.tar")
        _run(["tar", "--numeric-owner", "-C", root, "-cf", archive, "."])
        client.api.import_image_from_file(
            archive, repository=repository, tag=version, changes=list(r.image_changes)
        )
    image = client.images.get(tag)
    if previous is not None and previous != image.id:  # --force: do not leave it dangling
        try:
            client.images.remove(previous)
        except docker.errors.APIError as e:
            log.warning("kept the previous %s (%s): %s", tag, previous[:19], e)
    size = image.attrs.get("Size", 0)
    log.info("built %s in %.0f s (%.0f MB)", tag, time.perf_counter() - start, size / 1e6)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=None, help="default: wmrl-sandbox[-cuda]:<version>")
    parser.add_argument("--variant", default="cpu", choices=sorted(RECIPES))
    parser.add_argument("--force", action="store_true", help="rebuild an existing tag")
    parser.add_argument("--mirror", default=None, help="Debian mirror URL for mmdebstrap")
    parser.add_argument("--print", action="store_true", help="print the default tag and exit")
    parser.add_argument("--plan", action="store_true", help="print the build steps and exit")
    args = parser.parse_args(argv)
    if args.print:
        print(default_image(args.variant))
        return 0
    if args.plan:
        print(f"# {args.tag or default_image(args.variant)}")
        for step in build_steps("<rootfs>", variant=args.variant, mirror=args.mirror):
            print(" ".join(step))
        print("tar --numeric-owner -C <rootfs> -cf <rootfs>.tar .")
        changes = " ".join(f"--change {c!r}" for c in recipe(args.variant).image_changes)
        print(f"docker import {changes} <rootfs>.tar {args.tag or default_image(args.variant)}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    tag = build_image(args.tag, variant=args.variant, force=args.force, mirror=args.mirror)
    print(f"{tag} ready ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
