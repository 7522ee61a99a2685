"""Build the trainer image of the Kubernetes launch (`wmrl-jax:latest`) offline.

    python -m wmrl_jax.sandbox.trainer_image                 # wmrl-jax:latest, extras ray,cuda12
    python -m wmrl_jax.sandbox.trainer_image --extras=ray    # CPU-only nodes
    python -m wmrl_jax.sandbox.trainer_image --plan          # print the build steps, build nothing

The image `launch/k8s/trainer.yaml` and `launch/k8s/ray-executors.yaml` run:
this source checkout's wheel installed with its extras (`ray` for `ray start`
and the executors, `cuda12` for JAX on the trainer's GPUs), and the
`experiments/` tree in the working directory `/opt/wmrl_jax`, so that
`python -m experiments.train --config=experiments/configs/...` runs as the
manifest writes it. Built the way the sandbox image is (`image.py`), with no
registry: `mmdebstrap` writes a minimal Debian root filesystem with python3,
pip installs the wheel and its dependencies (binary wheels for the root's
Python, resolved) into it with `--target`, console scripts (`ray`) get
wrappers in /usr/local/bin, and the tree is loaded with `docker import`.
Needs root, `mmdebstrap` and an engine; Debian and PyPI must be reachable.
With `--extras=ray` it took 13 minutes on 2 busy cores (an image of 1.6 GB);
`cuda12` adds NVIDIA's CUDA wheels (several GB more).

On a machine that reaches a registry, `launch/trainer.Dockerfile` builds the
same contents with `docker build`. Either way the image reaches a cluster's
registry with `docker tag` + `docker push`, or a node without one with
`docker save | docker load` (see the README's cluster section).
"""

import argparse
import configparser
import glob
import logging
import os
import shutil
import sys
import tempfile
import time

import wmrl_jax
from wmrl_jax.sandbox import image

log = logging.getLogger(__name__)

REPOSITORY = "wmrl-jax"
TAG = "latest"  # what the manifests name
EXTRAS = ("ray", "cuda12")
WORKDIR = "/opt/wmrl_jax"
# What goes into the wheel's build and the image: the package and the launch configs.
SOURCES = ("setup.py", "README.md", "wmrl_jax")
RUN_TREE = "experiments"
DEBIAN_PACKAGES = ("python3", "libstdc++6", "ca-certificates")
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/bin:/usr/bin:/bin",
    "ENV LANG=C.UTF-8",
    "ENV PYTHONDONTWRITEBYTECODE=1",
    f"WORKDIR {WORKDIR}",
    'CMD ["python3"]',
)
SCRIPT = "#!/usr/bin/python3\nimport sys\nfrom {module} import {attr}\nsys.exit({call}())\n"


def source_root() -> str:
    """The checkout this package comes from (it holds setup.py and experiments/).

    Raises:
        RuntimeError: the package is installed, not a source checkout.
    """
    root = os.path.dirname(os.path.dirname(os.path.abspath(wmrl_jax.__file__)))
    missing = [p for p in (*SOURCES, RUN_TREE) if not os.path.exists(os.path.join(root, p))]
    if missing:
        raise RuntimeError(f"{root} is not a wmrl_jax source checkout (no {', '.join(missing)})")
    return root


def build_steps(
    root: str, wheel: str, *, extras=EXTRAS, mirror: str | None = None, python: str | None = None
) -> list[list[str]]:
    """The commands that write the trainer's root filesystem into `root`, in order.

    Args:
        root: the directory the tree goes into.
        wheel: the project's wheel file.
        extras: the project's extras to install with it.
        mirror: a Debian mirror URL for mmdebstrap.
        python: the interpreter whose pip fetches the wheels (default: this one).
    """
    debootstrap = [
        "mmdebstrap", "--quiet", "--variant=essential",
        "--include=" + ",".join(DEBIAN_PACKAGES),
        "--dpkgopt=path-exclude=/usr/share/{doc,man,info,locale}/*",
        "--dpkgopt=path-include=/usr/share/locale/locale.alias",
        image.SUITE, root,
    ]  # fmt: skip
    if mirror:
        debootstrap.append(mirror)
    platforms = [arg for platform in image.CUDA_PLATFORMS for arg in ("--platform", platform)]
    requirement = f"{wheel}[{','.join(extras)}]" if extras else wheel
    pip = [
        python or sys.executable, "-m", "pip", "install", "--quiet",
        "--disable-pip-version-check", "--no-cache-dir", "--only-binary=:all:",
        "--python-version", image.PYTHON_VERSION, "--implementation", "cp", *platforms,
        "--target", os.path.join(root, image.SITE_PACKAGES), requirement,
    ]  # fmt: skip
    return [debootstrap, pip]


def write_scripts(site: str, bin_dir: str) -> list[str]:
    """Wrappers in `bin_dir` for the console scripts of the distributions under `site`
    (pip's own point at the building host's interpreter); returns their names."""
    names = []
    for entry_points in sorted(glob.glob(os.path.join(site, "*.dist-info", "entry_points.txt"))):
        parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
        parser.optionxform = str  # script names are case-sensitive
        parser.read(entry_points)
        if not parser.has_section("console_scripts"):
            continue
        for name, target in parser.items("console_scripts"):
            module, _, call = target.split("[")[0].strip().partition(":")
            attr = call.split(".")[0]
            path = os.path.join(bin_dir, name)
            with open(path, "w") as f:
                f.write(SCRIPT.format(module=module, attr=attr, call=call))
            os.chmod(path, 0o755)
            names.append(name)
    return names


def build_rootfs(root: str, *, extras=EXTRAS, mirror: str | None = None) -> None:
    """Writes Debian, the project's wheel with `extras`, and experiments/ into `root`."""
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is not installed (Debian: apt-get install mmdebstrap)")
    src = source_root()
    with tempfile.TemporaryDirectory(prefix="wmrl-wheel-") as tmp:
        tree = os.path.join(tmp, "src")  # a clean copy: the checkout gets no build/ dir
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so")
        for name in SOURCES:
            path = os.path.join(src, name)
            if os.path.isdir(path):
                shutil.copytree(path, os.path.join(tree, name), ignore=ignore)
            else:
                os.makedirs(tree, exist_ok=True)
                shutil.copy(path, tree)
        dist = os.path.join(tmp, "dist")
        image._run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, tree])
        (wheel,) = glob.glob(os.path.join(dist, "*.whl"))
        for step in build_steps(root, wheel, extras=extras, mirror=mirror):
            image._run(step)
    site = os.path.join(root, image.SITE_PACKAGES)
    shutil.rmtree(os.path.join(site, "bin"), ignore_errors=True)
    log.info("scripts: %s", ", ".join(write_scripts(site, os.path.join(root, "usr/local/bin"))))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(
        os.path.join(src, RUN_TREE), os.path.join(root, WORKDIR[1:], RUN_TREE), ignore=ignore
    )
    for cache in ("var/cache/apt", "var/lib/apt/lists"):
        shutil.rmtree(os.path.join(root, cache), ignore_errors=True)


def build_image(
    tag: str = f"{REPOSITORY}:{TAG}", *, extras=EXTRAS, mirror: str | None = None, client=None
) -> str:
    """Builds the trainer image as `tag` (replacing it) and `wmrl-jax:<version>`; returns `tag`."""
    import docker

    client = client or docker.from_env()
    repository, _, version = tag.rpartition(":")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="wmrl-trainer-image-") as tmp:
        root = os.path.join(tmp, "rootfs")
        build_rootfs(root, extras=extras, mirror=mirror)
        archive = os.path.join(tmp, "rootfs.tar")
        image._run(["tar", "--numeric-owner", "-C", root, "-cf", archive, "."])
        client.api.import_image_from_file(
            archive, repository=repository, tag=version, changes=list(IMAGE_CHANGES)
        )
    built = client.images.get(tag)
    built.tag(REPOSITORY, wmrl_jax.__version__)
    size = built.attrs.get("Size", 0)
    log.info("built %s in %.0f s (%.0f MB)", tag, time.perf_counter() - start, size / 1e6)
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=f"{REPOSITORY}:{TAG}")
    parser.add_argument("--extras", default=",".join(EXTRAS), help="the project's extras")
    parser.add_argument("--mirror", default=None, help="Debian mirror URL for mmdebstrap")
    parser.add_argument("--plan", action="store_true", help="print the build steps and exit")
    args = parser.parse_args(argv)
    extras = tuple(e for e in args.extras.split(",") if e)
    if args.plan:
        print(f"# {args.tag}")
        print(f"{sys.executable} -m pip wheel --no-deps -w <dist> <copy of {' '.join(SOURCES)}>")
        for step in build_steps(
            "<rootfs>", "<dist>/wmrl_jax.whl", extras=extras, mirror=args.mirror
        ):
            print(" ".join(step))
        print(f"cp -r {RUN_TREE} <rootfs>{WORKDIR}/")
        print("# + a wrapper in <rootfs>/usr/local/bin for each console script (ray, ...)")
        changes = " ".join(f"--change {c!r}" for c in IMAGE_CHANGES)
        print(f"docker import {changes} <rootfs>.tar {args.tag}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    tag = build_image(args.tag, extras=extras, mirror=args.mirror)
    print(f"{tag} ready ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
