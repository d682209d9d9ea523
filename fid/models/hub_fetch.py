"""Hub models fetched once, where the internet is, into a folder that jobs read offline.

Compute nodes of most clusters cannot reach the hub, and where they can, 64 ranks filling one
cache at once race each other. `fid fetch-model` (the workflow's local rule `fetch_model`, run
on the login node before any GPU job) downloads what fid reads of a hub model (config.json,
the safetensors weights, the tokenizer's files) at one commit into a folder, atomically, with
`fetched.json`: the name, the commit sha, the hub it came from and every file's size and
sha256. Jobs then load that folder with HF_HUB_OFFLINE=1.

Where the hub cannot be reached, the model's snapshot in the local Hugging Face cache (a
download of an earlier session) is copied instead. `fetchable` says, without downloading,
whether either way will work: the workflow asks it when it builds the plan.
"""

from __future__ import annotations

import datetime
import fnmatch
import hashlib
import logging
import os
import shutil
from pathlib import Path

from fid.errors import InputError
from fid.runtime.fileio import atomic_directory, atomic_write_json

logger = logging.getLogger(__name__)

RECORD = "fetched.json"
# What fid reads of a model folder, at its top level: the config, the safetensors weights (and
# their index), the tokenizer (tokenizer.json, or the slow one's vocabulary: spiece.model,
# vocab.txt, vocab.json + merges.txt) and sentence-transformers' module files.
WANTED = ("*.json", "*.safetensors", "*.model", "vocab.txt", "merges.txt")
_TIMEOUT_S = 10.0


class HubModelError(InputError):
    """A hub model that cannot be fetched (unknown, unreachable, gated, without safetensors)."""


def folder_name(name: str) -> str:
    """The folder a hub model is fetched into (`google/flan-t5-base` -> google--flan-t5-base,
    as the hub's own cache names it)."""
    return name.replace("/", "--")


def _fetch_hint(name: str) -> str:
    return (f"run `fid fetch-model --name {name} --output resources/models/{folder_name(name)}` "
            "where the hub can be reached and copy that folder here")  # fmt: skip


def _wanted(files: list[str]) -> list[str]:
    return sorted(f for f in files if "/" not in f and any(fnmatch.fnmatch(f, p) for p in WANTED))


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _resolve_online(name: str, revision: str) -> tuple[str, list[str]] | None:
    """(commit sha, files) of `revision` from the hub; None when it cannot be reached.

    Raises:
        HubModelError: no such model or revision, or a gated/private model without access.
    """
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if _offline():
        return None
    try:
        info = HfApi(endpoint=_endpoint()).model_info(name, revision=revision, timeout=_TIMEOUT_S)
    except GatedRepoError:
        raise HubModelError(
            f"{name!r}: a gated model on {_endpoint()}: accept its terms there and log in "
            "(`hf auth login`, or HF_TOKEN) on this machine"
        ) from None
    except RevisionNotFoundError:
        raise HubModelError(f"{name!r}: no revision {revision!r} on {_endpoint()}") from None
    except RepositoryNotFoundError:
        raise HubModelError(
            f"{name!r}: no such model on {_endpoint()} (or a private one). Hint: check the "
            "name (models.reader / models.retriever / pretrained in the config)"
        ) from None
    except (HfHubHTTPError, OSError, *_transport_errors()) as error:  # the cache may have it
        logger.info("%s: the hub %s cannot be reached (%s)", name, _endpoint(), error)
        return None
    return info.sha, [s.rfilename for s in info.siblings or []]


def _transport_errors() -> tuple[type[Exception], ...]:
    """The HTTP client's errors for a host that cannot be reached (huggingface_hub 2 uses
    httpx2, 1.x httpx): connection refused, name not resolved, timeouts."""
    found = []
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _cached(name: str, revision: str) -> Path | None:
    """The model's snapshot folder in the local Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(name, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None


def fetchable(name: str, revision: str | None = None) -> str | None:
    """None when `fetch_model` can get `name` from here (the hub answers, or the local cache
    holds it), else why not, with the one command that fetches it elsewhere."""
    revision = revision or "main"
    try:
        if _resolve_online(name, revision) is not None or _cached(name, revision) is not None:
            return None
    except HubModelError as error:
        return str(error)
    where = "offline (HF_HUB_OFFLINE)" if _offline() else f"the hub {_endpoint()} cannot be reached"
    return (f"hub model {name!r} is not fetched, not in the local Hugging Face cache, and "
            f"{where}. Hint: {_fetch_hint(name)}")  # fmt: skip


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def fetch_model(name: str, output: str | Path, revision: str | None = None) -> dict:
    """`fid fetch-model`: a hub model's config, safetensors weights and tokenizer at one commit
    into `output` (replaced as a whole), with `fetched.json`.

    Args:
        name: the hub name (`t5-base`, `google/flan-t5-base`).
        output: the folder to write.
        revision: a branch, tag or commit sha (default "main"); the commit it resolves to is
            recorded, so the folder says exactly what it holds.

    Returns:
        The record written to `fetched.json`.

    Raises:
        HubModelError: an unknown or gated model, an unknown revision, a model without
            safetensors weights or config.json, or no hub and no cached copy.
    """
    from huggingface_hub import snapshot_download

    revision = revision or "main"
    online = _resolve_online(name, revision)
    cached = None if online is not None else _cached(name, revision)
    if online is None and cached is None:
        raise HubModelError(fetchable(name, revision) or f"{name!r}: cannot be fetched")
    files = _wanted(online[1] if online else [p.name for p in cached.iterdir()])
    lacking = [what for what, found in (("config.json", "config.json" in files),
               ("safetensors weights", any(f.endswith(".safetensors") for f in files)))
               if not found]  # fmt: skip
    if lacking:
        raise HubModelError(
            f"{name!r} at {revision!r} has no {' and no '.join(lacking)} (fid reads a model's "
            "config.json and safetensors only). Hint: another revision or model, or convert "
            "its weights to safetensors into a folder of your own"
        )
    with atomic_directory(output) as tmp:
        if online is not None:
            commit = online[0]
            snapshot_download(name, revision=commit, allow_patterns=files, local_dir=tmp,
                              endpoint=_endpoint())  # fmt: skip
            shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping
        else:
            commit = cached.name  # a snapshot folder is named by its commit
            for file in files:
                shutil.copyfile(cached / file, tmp / file)  # (the cache holds symlinks)
        missing = [f for f in files if not (tmp / f).is_file()]
        if missing:
            raise HubModelError(f"{name!r}: {', '.join(missing)} did not arrive")
        record = {
            "name": name,
            "revision": revision,
            "commit": commit,
            "source": _endpoint() if online is not None else f"local cache {cached}",
            "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "files": {
                f: {"bytes": (tmp / f).stat().st_size, "sha256": _sha256(tmp / f)} for f in files
            },  # fmt: skip
        }
        atomic_write_json(tmp / RECORD, record)
    total = sum(f["bytes"] for f in record["files"].values())
    logger.info("fetched %s at %s (%d files, %.2f GB) from %s into %s", name, commit[:12],
                len(files), total / 1e9, record["source"], output)  # fmt: skip
    return record


def take_jobs_offline() -> str:
    """Sets HF_HUB_OFFLINE=1 in this process's environment, which every job it starts
    inherits (the workflow's jobs read fetched folders and ask no hub), after importing
    huggingface_hub so that this process itself keeps the setting it was started with.

    Returns:
        That setting ("0" when unset): what the one job that fetches is given.
    """
    import huggingface_hub.constants  # noqa: F401 (it reads the variable once, on import)

    given = os.environ.get("HF_HUB_OFFLINE") or "0"
    os.environ["HF_HUB_OFFLINE"] = "1"
    return given
