"""Model manager, no UI: hardware detection, the model catalog, fit estimates, resumable verified
downloads from the Hugging Face hub, the local registry of installed models, tokens.

The first-run wizard, the app's Models screen and `dgchat models` are built on this package;
docs/MODELS.md describes the API. Importing it loads neither llama.cpp nor huggingface_hub.
"""

from __future__ import annotations

from dgchat.hub.catalog import ArchInfo, Catalog, CatalogEntry, load_catalog
from dgchat.hub.download import DownloadResult, PartialDownload, Progress, discard_partial, download_file, list_partials
from dgchat.hub.errors import (
    CatalogError,
    DiskFullError,
    DownloadCancelled,
    DownloadError,
    HubError,
    NoNetworkError,
    NotFoundOnHubError,
    RegistryError,
    TokenRequiredError,
    VerificationError,
)
from dgchat.hub.fit import Fit, FitEstimate, Recommendation, estimate, estimate_entry, recommend
from dgchat.hub.hardware import (
    GpuInfo,
    Hardware,
    clear_hardware_overrides,
    detect_hardware,
    load_hardware_overrides,
    save_hardware_overrides,
)
from dgchat.hub.hfcache import CachedGguf, find_in_hf_cache, scan_hf_cache
from dgchat.hub.manager import ModelManager, ModelRow, PullResult, RemoveResult, VerifyResult
from dgchat.hub.offline import enforce_offline, hub_network
from dgchat.hub.registry import InstalledModel, Registry
from dgchat.hub.remote import RemoteFile, resolve_remote
from dgchat.hub.tokens import TokenInfo, store_token, stored_token

__all__ = [
    "ArchInfo", "CachedGguf", "Catalog", "CatalogEntry", "CatalogError", "DiskFullError", "DownloadCancelled",
    "DownloadError", "DownloadResult", "Fit", "FitEstimate", "GpuInfo", "Hardware", "HubError", "InstalledModel",
    "ModelManager", "ModelRow", "NoNetworkError", "NotFoundOnHubError", "PartialDownload", "Progress", "PullResult", "Recommendation",
    "Registry", "RegistryError", "RemoteFile", "RemoveResult", "TokenInfo", "TokenRequiredError",
    "VerificationError", "VerifyResult", "clear_hardware_overrides", "detect_hardware", "discard_partial",
    "download_file", "enforce_offline", "estimate", "estimate_entry", "find_in_hf_cache", "hub_network",
    "list_partials", "load_catalog", "load_hardware_overrides", "recommend", "resolve_remote",
    "save_hardware_overrides", "scan_hf_cache", "store_token", "stored_token",
]
