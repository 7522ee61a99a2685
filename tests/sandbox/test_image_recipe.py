"""The image recipes, checked without building: tags, build steps, pins."""

import hashlib
import json

import pytest

import wmrl_jax
from wmrl_jax.sandbox import image


def test_cpu_tag_is_the_one_built_before_variants():
    # The digest of the CPU recipe is computed as before variants existed, so
    # images built then keep their tag.
    legacy = json.dumps(
        [image.SUITE, image.PYTHON_VERSION, image.DEBIAN_PACKAGES, image.WHEELS,
         image.IMAGE_CHANGES]
    )  # fmt: skip
    digest = hashlib.sha256(legacy.encode()).hexdigest()[:8]
    assert image.default_image() == f"wmrl-sandbox:{wmrl_jax.__version__}-{digest}"
    assert image.default_image("cpu") == image.default_image()


def test_cuda_variant_is_its_own_image():
    cuda = image.recipe("cuda")
    assert image.default_image("cuda").startswith("wmrl-sandbox-cuda:")
    assert image.image_version("cuda") != image.image_version("cpu")
    # The CPU libraries at the same pins, plus JAX on CUDA 12.
    assert cuda.wheels[: len(image.WHEELS)] == image.WHEELS
    pins = dict(w.split("==") for w in cuda.wheels)
    assert len(pins) == len(cuda.wheels)  # one pin per distribution
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        assert pins[name] == image.JAX_VERSION
    for lib in ("cublas", "cudnn", "nccl", "cuda-nvcc", "cuda-runtime", "cusolver", "cufft"):
        assert f"nvidia-{lib}-cu12" in pins
    assert "ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility" in cuda.image_changes
    assert cuda.image_changes[: len(image.IMAGE_CHANGES)] == image.IMAGE_CHANGES
    with pytest.raises(ValueError, match="unknown image variant 'rocm'"):
        image.recipe("rocm")


def test_cpu_build_steps_are_unchanged():
    mmdebstrap, pip = image.build_steps("/r", python="py", mirror="http://deb.example/debian")
    assert mmdebstrap == [
        "mmdebstrap", "--quiet", "--variant=essential",
        "--include=python3,libstdc++6,ca-certificates",
        "--dpkgopt=path-exclude=/usr/share/{doc,man,info,locale}/*",
        "--dpkgopt=path-include=/usr/share/locale/locale.alias",
        "bookworm", "/r", "http://deb.example/debian",
    ]  # fmt: skip
    assert pip == [
        "py", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
        "--platform", "manylinux2014_x86_64",
        "--target", "/r/usr/local/lib/python3.11/dist-packages", *image.WHEELS,
    ]  # fmt: skip


def test_cuda_build_steps_install_every_pin_for_the_images_python():
    cpu_debootstrap, cpu_pip = image.build_steps("/r", python="py")
    debootstrap, pip = image.build_steps("/r", variant="cuda", python="py")
    assert debootstrap == cpu_debootstrap  # the same Debian tree
    target = pip.index("--target")
    assert pip[target + 1] == "/r/usr/local/lib/python3.11/dist-packages"
    assert pip[target + 2 :] == list(image.recipe("cuda").wheels)
    assert {"--no-deps", "--only-binary=:all:"} <= set(pip)
    assert pip[pip.index("--python-version") + 1] == image.PYTHON_VERSION
    platforms = {pip[i + 1] for i, arg in enumerate(pip) if arg == "--platform"}
    # jaxlib and the CUDA wheels are manylinux_2_27; bookworm's glibc is 2.36.
    assert {"manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_36_x86_64"} <= platforms
    assert "manylinux_2_37_x86_64" not in platforms
    assert pip[: pip.index("--platform")] == cpu_pip[: cpu_pip.index("--platform")]


def test_plan_prints_the_steps_without_building(capsys):
    assert image.main(["--variant=cuda", "--plan"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"# {image.default_image('cuda')}"
    assert out[1].startswith("mmdebstrap ") and f"jax-cuda12-plugin=={image.JAX_VERSION}" in out[2]
    assert out[-1].startswith("docker import ") and out[-1].endswith(image.default_image("cuda"))
    assert image.main(["--variant=cuda", "--print"]) == 0
    assert capsys.readouterr().out.strip() == image.default_image("cuda")
