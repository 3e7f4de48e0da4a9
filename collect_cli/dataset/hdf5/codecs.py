"""HDF5 filters for the codecs of ``dataformat.CODECS`` (hdf5plugin's for zstd, lz4, Blosc2)."""

from __future__ import annotations

from typing import Any

from collect_cli import dataformat as fmt
from collect_cli.errors import ConfigError


def load_plugin() -> None:
    """Register hdf5plugin's filters (zstd, lz4, Blosc2) with HDF5, once."""
    try:
        import hdf5plugin  # noqa: F401  (importing it registers the filters)
    except ImportError:
        raise ConfigError(
            "this codec needs hdf5plugin (a dependency of rlcollect): pip install hdf5plugin"
        ) from None


def codec_filter(name: str, level: int | None) -> dict[str, Any]:
    """h5py ``create_dataset`` options for codec ``name`` (``fmt.CODECS``) at ``level``."""
    meta = fmt.codec_meta(name, level)
    level = meta["level"]
    if name == "none":
        return {}
    if name == "gzip":
        return {"compression": "gzip", "compression_opts": level}
    if name == "lzf":
        return {"compression": "lzf"}
    load_plugin()
    import hdf5plugin

    if name == "zstd":
        return dict(hdf5plugin.Zstd(clevel=level))
    if name == "lz4":
        return dict(hdf5plugin.LZ4())
    cname = "zstd" if name == "blosc2-zstd" else "lz4"
    return dict(hdf5plugin.Blosc2(cname=cname, clevel=level, filters=hdf5plugin.Blosc2.SHUFFLE))


def needs_plugin(meta: dict[str, Any]) -> None:
    """Load hdf5plugin where the dataset's codec needs it (readers need no extra step)."""
    if (meta.get(fmt.CODEC) or {}).get("plugin"):
        load_plugin()
