"""Pixel observations in the HDF5 writer: chunks sized by bytes, compression that pays."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from collect_cli import dataformat as fmt
from collect_cli.dataset.hdf5.chunks import CHUNK_MAX, CHUNK_MIN, chunk_cache, chunk_shape
from tests.helpers import assert_consistent

PIXELS = ("env=gym", "env.id=pixelenvs:Pixels-v0", "env.num_envs=2", "total_frames=400")


@pytest.mark.parametrize(
    ("row_bytes", "batch_steps", "steps"),
    [
        (64 * 64 * 3, 125, 25),  # a divisor of the batch's 125 steps: whole chunks per batch
        (84 * 84 * 3, 125, 25),
        (84 * 84 * 3, 100, 25),
        (64 * 64 * 3, 127, 42),  # 127 is prime: ~512 KiB chunks
        (210 * 160 * 3, 125, 5),  # Atari frames
    ],
)
def test_large_frames_chunked_by_bytes_one_lane(row_bytes, batch_steps, steps):
    lanes, got = chunk_shape(row_bytes, 8, batch_steps, 65536)
    assert (lanes, got) == (1, steps)
    assert CHUNK_MIN <= got * row_bytes <= CHUNK_MAX
    cache = chunk_cache(got * row_bytes, 8)
    assert cache["rdcc_nbytes"] >= 9 * got * row_bytes or cache["rdcc_nbytes"] == 64 << 20
    slots = cache["rdcc_nslots"]
    assert all(slots % d for d in range(2, int(slots**0.5) + 1))  # prime


@pytest.mark.parametrize(
    ("row_bytes", "width", "batch_steps", "chunk_frames", "shape"),
    [
        (4, 4096, 100, 65536, (512, 100)),  # one batch fills whole chunks: 512 divides 4096
        (12, 4096, 100, 65536, (512, 100)),  # 3 floats: 600 KiB chunks
        (8, 6000, 100, 65536, (600, 100)),  # 655 lanes fit; 600 divides 6000
        (4, 8, 125, 65536, (8, 125)),  # every lane of a small batch in one chunk
        (4, 8, 1, 65536, (8, 16)),  # tiny batches: 16 steps, filled over 16 batches
        (4, 8, 125, 100, (1, 100)),  # chunk_frames caps the frames per chunk
        (4, 4096, 100, 1000, (8, 100)),  # 10 lanes fit; 8 divides 4096
    ],
)
def test_small_frames_chunked_across_lanes_per_batch(
    row_bytes, width, batch_steps, chunk_frames, shape
):
    got = chunk_shape(row_bytes, width, batch_steps, chunk_frames)
    assert got == shape
    assert got[0] * got[1] <= chunk_frames and got[0] * got[1] * row_bytes <= CHUNK_MAX


def test_pixel_run_gzip_validates_and_compresses(cli, tmp_path):
    raw, packed = tmp_path / "raw.h5", tmp_path / "gzip.h5"
    full = ("+env.kwargs.size=84", "writer.layout=full")  # next/observation stored too
    res = cli("run", *PIXELS, *full, "writer.compression=none", f"out={raw}")
    assert res.code == 0, res.stderr
    res = cli("run", *PIXELS, *full, "writer.compression=gzip", f"out={packed}")
    assert res.code == 0, res.stderr
    assert cli("validate", str(packed)).code == 0
    assert_consistent(packed)
    with h5py.File(raw, "r") as a, h5py.File(packed, "r") as b:
        obs = b["observation"]
        assert obs.compression == "gzip" and obs.dtype == np.uint8
        assert obs.shape[2:] == (84, 84, 3)
        assert CHUNK_MIN <= np.prod(obs.chunks) <= CHUNK_MAX  # uint8: bytes = elements
        np.testing.assert_array_equal(a["observation"][:], obs[:])  # lossless, same seed
        np.testing.assert_array_equal(a["next/observation"][:], b["next/observation"][:])
        image_bytes = obs.nbytes + b["next/observation"].nbytes
        assert obs[0, 0].std() > 10  # structured frames, not blank ones
    assert packed.stat().st_size * 10 < image_bytes < raw.stat().st_size


def test_a_default_run_stores_image_leaves_with_zstd_and_says_so(cli, tmp_path):
    import hdf5plugin  # noqa: F401  (h5py reads zstd chunks once it is imported)

    default, raw = tmp_path / "default.h5", tmp_path / "raw.h5"
    full = ("+env.kwargs.size=84", "writer.layout=full")
    assert cli("run", *PIXELS, *full, f"out={default}").code == 0
    assert cli("run", *PIXELS, *full, "writer.compression=none", f"out={raw}").code == 0
    assert cli("validate", str(default)).code == 0
    zstd = fmt.CODECS["zstd"][0]
    with h5py.File(default, "r") as f, h5py.File(raw, "r") as r:
        for key in ("observation", "next/observation"):  # the image leaves: zstd
            assert f[key].id.get_create_plist().get_filter(0)[0] == zstd
            np.testing.assert_array_equal(f[key][:], r[key][:])  # lossless
            assert r[key].id.get_create_plist().get_nfilters() == 0  # none: raw frames
        for key in ("action", "next/reward", "collector/mask"):  # the rest: raw
            assert f[key].id.get_create_plist().get_nfilters() == 0
    assert default.stat().st_size * 20 < raw.stat().st_size  # Pong's figure: benchmarks/
    info = json.loads(cli("info", str(default), "--json").stdout)
    assert info["codec"]["name"] == "zstd" and info["codec"]["leaves"] == "images"
    assert "zstd level 3 (image leaves)" in cli("info", str(default)).stdout
    assert json.loads(cli("info", str(raw), "--json").stdout)["codec"]["name"] == "none"
    report = json.loads(cli("report", str(default), "--json").stdout)[0]["summary"]
    assert (report["layout"], report["codec"]) == ("full", "zstd level 3 (image leaves)")


def test_a_default_run_of_a_vector_env_compresses_nothing(cli, tmp_path):
    out = tmp_path / "pendulum.h5"
    assert cli("run", "env=Pendulum", "total_frames=200", f"out={out}").code == 0
    with h5py.File(out, "r") as f:
        assert f["observation"].id.get_create_plist().get_nfilters() == 0
    info = json.loads(cli("info", str(out), "--json").stdout)
    assert info["codec"]["name"] == "none"
