"""The pure rules of ``collect_cli/dataformat.py``, tested directly.

Each input is a small hand-built numpy array or metadata dict, and each expected
answer is worked out by hand in the test (not recomputed with the rule's formula).
"""

from __future__ import annotations

import numpy as np
import pytest

from collect_cli import dataformat as fmt

eq = np.testing.assert_array_equal


def test_path_joins_parts_and_key_of_splits_them_back():
    assert fmt.path(("next", "observation", "pixels")) == "next/observation/pixels"
    assert fmt.path("already/joined") == "already/joined"
    assert fmt.key_of("next/observation/pixels") == ("next", "observation", "pixels")
    assert fmt.key_of(fmt.path(("collector", "mask"))) == ("collector", "mask")
    assert fmt.TRAJ == "collector/traj_ids" and fmt.MASK == "collector/mask"


def test_path_rejects_non_string_parts_and_a_slash_inside_a_part_does_not_round_trip():
    with pytest.raises(TypeError):
        fmt.path(("observation", 0))
    assert fmt.key_of(fmt.path(("a/b",))) == ("a", "b")


def test_described_leaves_nests_dict_and_tuple_keys():
    box, text, disc = {"type": "Box"}, {"type": "Text"}, {"type": "Discrete"}
    desc = {
        "type": "Dict",
        "spaces": {"pos": box, "inner": {"type": "Tuple", "spaces": [text, disc]}},
    }
    assert list(fmt.described_leaves(desc)) == [
        (("pos",), box),
        (("inner", "0"), text),
        (("inner", "1"), disc),
    ]
    assert list(fmt.described_leaves(box)) == [((), box)]
    assert list(fmt.described_leaves(None)) == []


def test_text_keys_names_both_observation_and_next_observation():
    assert fmt.text_keys({"observation_space": {"type": "Text"}}) == {
        ("observation",),
        ("next", "observation"),
    }
    nested = {"type": "Dict", "spaces": {"img": {"type": "Box"}, "mission": {"type": "Text"}}}
    assert fmt.text_keys({"observation_space": nested}) == {
        ("observation", "mission"),
        ("next", "observation", "mission"),
    }
    assert fmt.text_keys({}) == set()


def test_fixed_bytes_turns_zero_padded_utf8_rows_into_byte_strings():
    text = np.array([[[104, 105, 0], [97, 0, 0]]], np.uint8)  # [1, 2, width 3]: "hi", "a"
    out = fmt.fixed_bytes(text)
    assert out.dtype == np.dtype("S3") and out.shape == (1, 2)
    assert out.tolist() == [[b"hi", b"a"]]
    already = np.array([b"xy", b"z"], "S2")
    assert fmt.fixed_bytes(already) is already


def test_holds_text_is_fixed_bytes_or_uint8_only():
    assert fmt.holds_text("S16") and fmt.holds_text("|S4") and fmt.holds_text("uint8")
    assert not fmt.holds_text("float32")
    assert not fmt.holds_text("int8")
    assert not fmt.holds_text("bool")


def test_episodes_column_paths():
    assert fmt.column("return") == "episodes/return"
    assert fmt.is_episodes("episodes/traj_id")
    assert not fmt.is_episodes("episodes")
    assert not fmt.is_episodes("episodes_old/traj_id")
    assert not fmt.is_episodes("observation")


def test_empty_rows_has_every_column_with_its_dtype():
    rows = fmt.empty_rows()
    assert list(rows) == [
        "traj_id", "lane", "start", "length", "return", "terminated", "truncated", "complete",
        "source",
    ]  # fmt: skip
    assert all(len(v) == 0 for v in rows.values())
    assert rows["traj_id"].dtype == np.int64 and rows["return"].dtype == np.float64
    assert rows["complete"].dtype == np.bool_


def rows_of(**given) -> fmt.Rows:
    """Episode rows: the given columns, the others zero."""
    n = len(next(iter(given.values())))
    return {k: np.asarray(given.get(k, np.zeros(n)), dt) for k, dt in fmt.COLUMNS.items()}


def test_concat_rows_appends_parts_in_order_and_keeps_only_the_columns():
    a = rows_of(traj_id=[3, 4], complete=[True, False])
    b = rows_of(traj_id=[7], complete=[True])
    b["extra"] = np.array([1])
    rows = fmt.concat_rows([a, b])
    assert set(rows) == set(fmt.COLUMNS)
    eq(rows["traj_id"], [3, 4, 7])
    eq(rows["complete"], [True, False, True])
    assert fmt.concat_rows([])["lane"].shape == (0,)


def test_return_stats_counts_complete_episodes_only():
    rows = rows_of(**{"return": [1.0, 3.0, 100.0], "complete": [True, True, False]})
    assert fmt.return_stats(rows) == {"mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0}


def test_return_stats_is_none_without_a_complete_episode():
    assert fmt.return_stats(rows_of(**{"return": [5.0], "complete": [False]})) is None
    assert fmt.return_stats(fmt.empty_rows()) is None


def test_lane_steps_even_unless_recorded_and_committed_covers_them():
    eq(fmt.lane_steps({"lanes": 3, "steps": 4}), [4, 4, 4])
    eq(fmt.lane_steps({"lanes": 2, "steps": 4, "lane_steps": [2, 4]}), [2, 4])
    eq(fmt.lane_steps({"lanes": 2, "steps": 1, "lane_steps": []}), [1, 1])  # empty: even
    meta = {"lanes": 2, "steps": 3, "lane_steps": [1, 3]}
    eq(fmt.committed(meta), [[True, False, False], [True, True, True]])


def test_lookahead_is_n_only_for_multistep():
    assert fmt.lookahead({}) == 1
    assert fmt.lookahead({"postproc": None}) == 1
    assert fmt.lookahead({"postproc": {"name": "multistep", "n": 3}}) == 3
    assert fmt.lookahead({"postproc": {"name": "multistep"}}) == 1
    assert fmt.lookahead({"postproc": {"name": "none", "n": 3}}) == 1


def test_own_step_plain_reads_next_reward_and_done_in_shape():
    stored = {
        fmt.REWARD_KEY: np.array([1, 2, 3, 4], np.float32),  # flat, as [2, 2]
        fmt.DONE_KEY: np.array([0, 1, 0, 0], np.uint8),
    }
    reward, done = fmt.own_step(stored.get, (2, 2))
    assert reward.dtype == np.float64 and done.dtype == np.bool_
    eq(reward, [[1.0, 2.0], [3.0, 4.0]])
    eq(done, [[False, True], [False, False]])


def test_own_step_after_multistep_uses_original_reward_and_one_step_dones():
    stored = {
        fmt.REWARD_KEY: np.array([[9.0, 9.0, 9.0]]),
        fmt.ORIGINAL_REWARD_KEY: np.array([[1.0, 2.0, 3.0]]),
        fmt.DONE_KEY: np.array([[True, True, True]]),
        fmt.STEPS_TO_NEXT_KEY: np.array([[3, 2, 1]]),  # only the last frame's own step ended
    }
    reward, done = fmt.own_step(stored.get, (1, 3))
    eq(reward, [[1.0, 2.0, 3.0]])
    eq(done, [[False, False, True]])


def test_last_valid_looks_only_before_each_lanes_end():
    mask = np.array([[1, 1, 0, 1], [0, 0, 0, 0], [1, 0, 1, 1], [1, 1, 1, 1]], bool)
    eq(fmt.last_valid(mask, np.array([3, 4, 2, 0])), [1, -1, 0, -1])


# lane 0: trajectory 1 runs past padding to the end; lane 1: trajectory 3 cut at its
# end 3; lane 2: trajectory 4 already has a row; lane 3: only padding
TRAJ = np.array([[0, 0, 1, -1, 1], [2, 2, 3, 3, 3], [4, 4, 4, 4, 4], [-1] * 5])
MASK = TRAJ >= 0
ENDS = np.array([5, 3, 5, 5])


def test_tail_rows_are_the_unrecorded_last_trajectories_marked_cut():
    reward = np.array([[1, 2, 4, 100, 8], [1, 1, 16, 32, 64], [1] * 5, [0] * 5], float)
    rows = fmt.tail_rows(TRAJ, MASK, reward, ENDS, known={4})
    eq(rows["traj_id"], [1, 3])
    eq(rows["lane"], [0, 1])
    eq(rows["start"], [2, 2])
    eq(rows["length"], [2, 1])  # padding and frames past the end do not count
    eq(rows["return"], [12.0, 16.0])
    for flag in ("terminated", "truncated", "complete"):
        eq(rows[flag], [False, False])
    assert {k: v.dtype for k, v in rows.items()} == fmt.COLUMNS


def test_tail_rows_empty_when_every_last_trajectory_is_known():
    rows = fmt.tail_rows(TRAJ, MASK, np.zeros(TRAJ.shape), ENDS, known={1, 3, 4})
    assert set(rows) == set(fmt.COLUMNS) and all(len(v) == 0 for v in rows.values())
    assert rows["traj_id"].dtype == np.int64 and rows["complete"].dtype == np.bool_


def test_cut_points_are_the_last_stored_frames_of_cut_rows():
    rows = rows_of(lane=[2, 0, 1], complete=[True, False, False])
    lanes, times = fmt.cut_points(rows, MASK, ENDS)
    eq(lanes, [0, 1])
    eq(times, [4, 2])
    lanes, times = fmt.cut_points(rows_of(lane=[0], complete=[True]), MASK, ENDS)
    assert len(lanes) == 0 and len(times) == 0


def test_is_image_is_uint8_of_rank_two_or_more():
    assert fmt.is_image((84, 84), np.uint8) and fmt.is_image((4, 84, 84, 3), np.uint8)
    assert not fmt.is_image((8,), np.uint8)
    assert not fmt.is_image((), np.uint8)
    assert not fmt.is_image((84, 84), np.float32)


LEAVES = [
    (("observation", "pixels"), (64, 64, 3), np.dtype(np.uint8)),
    (("observation", "state"), (4,), np.dtype(np.float32)),
    (("action",), (2,), np.dtype(np.float32)),
    (("collector", "frames"), (8, 8), np.dtype(np.uint8)),
    (("observation_extra",), (8, 8), np.dtype(np.uint8)),
]


@pytest.mark.parametrize(
    ("layout", "expected"),
    [
        ("full", []),
        ("auto", [("observation", "pixels")]),
        ("compact", [("observation", "pixels"), ("observation", "state")]),
    ],
)
def test_compact_keys_per_layout_only_observations(layout, expected):
    assert fmt.compact_keys(LEAVES, layout) == expected


def test_next_and_final_keys_prefix_the_observation_key():
    assert fmt.next_key(("observation", "pixels")) == ("next", "observation", "pixels")
    assert fmt.final_key(("observation",)) == ("final", "observation")


def test_final_points_keeps_episode_ends_trajectory_changes_and_batch_ends():
    traj = np.array([[0, 0, 0, 1, 1], [2, -1, 2, 3, -1], [-1] * 5])
    done = np.array([[0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1] * 5], bool)  # padding's done: no
    lanes, times = fmt.final_points(traj, traj >= 0, done)
    # lane 0: episode end 2, batch end 4; lane 1: 2 (next valid frame is trajectory 3),
    # 3 (last valid frame of the batch); 0 is followed, past padding, by its own trajectory
    eq(lanes, [0, 0, 1, 1])
    eq(times, [2, 4, 2, 3])


def test_valid_finals_drops_unwritten_rows_and_rows_past_the_lanes_end():
    lane = np.array([0, -1, 1, 2, 0, 1])
    time = np.array([3, -1, 5, 0, 4, 4])
    eq(fmt.valid_finals(lane, time, np.array([4, 5])), [True, False, False, False, False, True])


# lane 0: trajectory 0 with padding inside, ending at 3; trajectory 1 to the batch end
# lane 1: trajectory 2, committed up to 3; final rows: 3 past that end, 4 unwritten
C_TRAJ = np.array([[0, 0, -1, 0, 1, 1], [2, 2, 2, -1, -1, -1]])
C_LANE = np.array([0, 0, 1, 1, -1])
C_TIME = np.array([3, 5, 2, 4, -1])
C_ENDS = np.array([6, 3])


def test_next_sources_points_at_the_next_valid_frame_or_a_final_row():
    t_next, row = fmt.next_sources(C_TRAJ, C_TRAJ >= 0, C_LANE, C_TIME, C_ENDS)
    eq(t_next, [[1, 3, -1, -1, 5, -1], [1, 2, -1, -1, -1, -1]])
    eq(row, [[-1, -1, -1, 0, -1, 1], [-1, -1, 2, -1, -1, -1]])


def test_next_sources_a_later_final_row_for_the_same_frame_wins():
    lane, time = np.array([0, 0, 0]), np.array([1, 3, 1])
    t_next, row = fmt.next_sources(C_TRAJ[:1], C_TRAJ[:1] >= 0, lane, time, np.array([6]))
    eq(row, [[-1, 2, -1, 1, -1, -1]])
    eq(t_next, [[1, -1, -1, -1, 5, -1]])


def test_rebuild_next_restores_next_observations_across_an_episode_end_and_padding():
    frame = np.array([[0, 1, 2, 3, 4, 5], [100, 101, 102, 103, 104, 105]])
    obs = np.stack([frame, -frame], axis=-1)  # [2 lanes, 6 steps, 2]
    finals = np.array([[33, -33], [55, -55], [122, -122], [999, -999], [777, -777]])
    t_next, row = fmt.next_sources(C_TRAJ, C_TRAJ >= 0, C_LANE, C_TIME, C_ENDS)
    rebuilt = fmt.rebuild_next(obs, finals, t_next, row)
    expected = np.array([[1, 3, 0, 33, 5, 55], [101, 102, 122, 0, 0, 0]])
    eq(rebuilt, np.stack([expected, -expected], axis=-1))
    assert rebuilt.dtype == obs.dtype


@pytest.mark.parametrize(
    ("name", "level", "expected"),
    [
        ("none", None, {"name": "none", "level": None, "filter_id": None, "plugin": None}),
        ("gzip", None, {"name": "gzip", "level": 4, "filter_id": 1, "plugin": None}),
        ("gzip", 9, {"name": "gzip", "level": 9, "filter_id": 1, "plugin": None}),
        ("gzip", 0, {"name": "gzip", "level": 0, "filter_id": 1, "plugin": None}),
        ("lzf", 5, {"name": "lzf", "level": None, "filter_id": 32000, "plugin": None}),
        ("zstd", None, {"name": "zstd", "level": 3, "filter_id": 32015, "plugin": "hdf5plugin"}),
        ("lz4", None, {"name": "lz4", "level": None, "filter_id": 32004, "plugin": "hdf5plugin"}),
    ],
)
def test_codec_meta_fills_default_levels_and_drops_levels_a_codec_lacks(name, level, expected):
    leaves = None if name == "none" else "all"
    assert fmt.codec_meta(name, level) == {**expected, "leaves": leaves}


def test_auto_compresses_image_leaves_only():
    assert fmt.leaf_codec("auto", (84, 84, 3), np.uint8) == "zstd"
    assert fmt.leaf_codec("auto", (4, 84, 84), np.uint8) == "zstd"  # a frame stack
    assert fmt.leaf_codec("auto", (84, 84), np.uint8) == "zstd"  # grayscale
    assert fmt.leaf_codec("auto", (84, 84, 3), np.float32) == "none"  # not an image
    assert fmt.leaf_codec("auto", (128,), np.uint8) == "none"  # Atari RAM
    assert fmt.leaf_codec("none", (84, 84, 3), np.uint8) == "none"  # raw where asked
    assert fmt.leaf_codec("gzip", (3,), np.float32) == "gzip"  # a named codec: every leaf


def test_codec_text_names_the_codec_and_its_leaves():
    assert fmt.codec_text(None) == "none"
    assert fmt.codec_text(fmt.codec_meta("none", None)) == "none"
    assert fmt.codec_text(fmt.codec_meta("lzf", None)) == "lzf"
    images = fmt.codec_meta("zstd", None, fmt.IMAGE_LEAVES)
    assert fmt.codec_text(images) == "zstd level 3 (image leaves)"


def test_codec_meta_rejects_an_unknown_codec():
    with pytest.raises(KeyError):
        fmt.codec_meta("brotli", None)
