"""``writer=hdf5``'s options and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from collect_cli.config_checks import choice, importable, ranged
from collect_cli.dataformat import AUTO, CODECS, IMAGE_CODEC, PLUGIN
from collect_cli.errors import ConfigError
from collect_cli.schema import WriterConfig


@dataclass
class Hdf5WriterConfig(WriterConfig):
    name: str = "hdf5"
    # auto (image leaves zstd, the rest raw) | none | gzip | lzf | zstd | lz4 | blosc2 | blosc2-zstd
    compression: str = AUTO
    compression_level: int | None = None  # None: the codec's default
    chunk_frames: int = ranged(65536, low=1)  # frames per chunk (lanes x time steps), at most


def check(options: Hdf5WriterConfig) -> None:
    """An unknown codec, a level out of its range, or a plugin codec without the plugin."""
    name, level = options.compression, options.compression_level
    choice("writer.compression", name, (AUTO, *CODECS))
    _, levels, _, plugin = CODECS[IMAGE_CODEC if name == AUTO else name]
    if level is not None and levels is None:
        raise ConfigError(
            f"writer.compression={name} takes no level: drop writer.compression_level"
        )
    if level is not None and not levels[0] <= level <= levels[1]:
        raise ConfigError(
            f"writer.compression_level={level} is out of range for {name}: {levels[0]}..{levels[1]}"
        )
    if plugin and not importable(PLUGIN):
        raise ConfigError(
            f"writer.compression={name} needs {PLUGIN}: pip install {PLUGIN} "
            "(or choose gzip or lzf)"
        )


OPTIONS = Hdf5WriterConfig
