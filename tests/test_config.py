"""Config composition and validation (no env started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collect_cli import config, schema
from collect_cli.errors import ConfigError
from collect_cli.policies.sb3.options import Sb3PolicyConfig
from collect_cli.rollout import RolloutOptions


def settings(*overrides: str) -> config.Settings:
    return config.load(config.compose(list(overrides)))


def test_defaults():
    s = settings()
    assert s.env.id == "Pendulum-v1" and s.env.num_envs == 8
    assert s.total_frames == 1_000_000 and s.frames_per_batch == 1000
    assert s.policy.name == "random" and s.writer.name == "hdf5"
    assert s.out == Path("data/Pendulum-v1_random_s0.h5")
    assert "total_frames: 1000000" in s.config_yaml


@pytest.mark.parametrize(
    ("value", "expected"), [("1e6", 1_000_000), ("20000", 20000), ("-1", -1), ("2.0e3", 2000)]
)
def test_total_frames_accepts_scientific(value, expected):
    assert settings(f"total_frames={value}").total_frames == expected


@pytest.mark.parametrize("value", ["1.5", "abc", "0", "-2", "true", "1e400"])
def test_total_frames_rejects(value):
    with pytest.raises(ConfigError, match="total_frames"):
        settings(f"total_frames={value}")


def test_groups_and_memmap_default_out():
    s = settings("env=CartPole", "policy=mlp", "policy.hidden=[32]", "writer=memmap", "seed=4")
    assert s.env.id == "CartPole-v1" and s.policy.hidden == [32]
    assert s.out == Path("data/CartPole-v1_mlp_s4")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["policy=nope"], "policy"),
        (["policy=mlp", "policy.activation=swish"], "choose from tanh"),
        (["policy.activation=relu"], "activation"),
        (["writer.compression=brotli"], "choose from auto, none, gzip, lzf, zstd, lz4, blosc2"),
        (["writer.layout=sparse"], "choose from auto, full, compact"),
        (["writer.commit_interval=-1"], "writer.commit_interval must be a number of seconds"),
        (["writer=memmap", "writer.commit_interval=nan"], "writer.commit_interval"),
        (["writer.compression=zstd", "writer.compression_level=0"], "out of range"),
        (["progress=loud"], "choose from auto"),
        (["env.num_envs=0"], "num_envs"),
        (["env.backend=torch"], "choose from gymnasium, envpool, native"),
        (["seed=abc"], "seed"),
    ],
)
def test_invalid_values(overrides, message):
    with pytest.raises(ConfigError, match=message):
        settings(*overrides)


def test_conf_ships_inside_package():
    assert (config.conf_dir() / "config.yaml").is_file()
    assert (config.conf_dir() / "env" / "Acrobot.yaml").is_file()


def test_every_group_option_is_a_registered_schema():
    s = settings("policy=sb3", "policy.path=m.zip", "collector=multisync", "postproc=multistep")
    assert isinstance(s.policy, Sb3PolicyConfig) and s.policy.deterministic
    assert isinstance(s.collector, schema.MultiSyncCollectorConfig) and s.collector.workers == 2
    assert isinstance(s.postproc, schema.MultiStepPostprocConfig) and s.postproc.n == 3
    assert s.rollout == RolloutOptions()  # the rollout options travel as one object
    with pytest.raises(AttributeError):
        s.seed = 1  # type: ignore[misc]  # frozen: what load() checked stays checked


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # Hydra checks each key against the option's own schema while composing
        (["collector.workers=3"], "collector.workers"),  # sync has no workers
        (["policy=mlp", "policy.hidden=[a]"], "policy.hidden"),
        (["collector=multisync", "collector.workers=two"], "collector.workers"),
        (["postproc=multistep", "postproc.n=1.5"], "postproc.n"),
        (["writer=memmap", "writer.compression=gzip"], "writer.compression"),
    ],
)
def test_schemas_refuse_keys_and_types_while_composing(overrides, message):
    with pytest.raises(ConfigError, match=message):
        settings(*overrides)


def test_yaml_holds_only_what_differs_from_the_schemas():
    import yaml

    defaults = vars(schema.EnvConfig(name="", id=""))
    for file in sorted((config.conf_dir() / "env").glob("*.yaml")):
        preset = yaml.safe_load(file.read_text())
        assert preset["name"] == file.stem
        same = {k for k, v in preset.items() if k in defaults and v == defaults[k]}
        assert not same, f"{file.name} repeats the schema's {sorted(same)}"
    top = yaml.safe_load((config.conf_dir() / "config.yaml").read_text())
    assert set(top) == {"defaults"}  # every other key's default is RunConfig's
    for group in config.GROUPS:
        assert not (config.conf_dir() / group).exists(), f"conf/{group}/ duplicates the schemas"


def test_run_help_names_every_group_option_and_key():
    """``rlcollect run --help`` (the registries' part made when it is shown) names
    every preset, group option and config key."""
    import dataclasses
    import re

    from collect_cli.cli.collect import _run_help

    text = _run_help()
    words = set(re.findall(r"[\w.\-]+", text.replace("|\n", "|")))
    words |= {w for line in text.splitlines() for w in re.split(r"[=|\s]+", line)}
    presets = {p.stem for p in (config.conf_dir() / "env").glob("*.yaml")}
    assert presets <= words, presets - words
    for group, options in config.GROUPS.items():
        assert set(options) <= words, (group, set(options) - words)
        keys = {f"{group}.{f.name}" for c in options.values() for f in dataclasses.fields(c)}
        assert keys - {f"{group}.name"} <= words, (group, keys - words)
    for field in dataclasses.fields(schema.RunConfig):
        if field.name in config.GROUPS:
            continue
        if field.name in ("env", "dataset", "record"):
            sub = schema.EnvConfig if field.name == "env" else field.default_factory()
            names = {f"{field.name}.{f.name}" for f in dataclasses.fields(sub)}
            assert names - {"env.name"} <= words, names - words
        else:
            assert field.name in words, field.name


def numeric_options():
    """(overrides selecting the schema, key, kind) of every float and integer option."""
    import dataclasses
    import typing

    from collect_cli.config_checks import numeric_kind

    needs = {"torchscript": "policy.path=p", "export": "policy.path=p", "sb3": "policy.path=p"}
    needs["python"] = "policy.target=m:f"
    schemas = [([], "", schema.RunConfig), ([], "env.", schema.EnvConfig)]
    schemas.append(([], "dataset.", schema.DatasetConfig))
    for group, options in config.GROUPS.items():
        for option, options_class in options.items():
            select = [f"{group}={option}", *([needs[option]] if option in needs else [])]
            schemas.append((select, f"{group}.", options_class))
    for select, prefix, options_class in schemas:
        hints = typing.get_type_hints(options_class)
        for item in dataclasses.fields(options_class):
            if kind := numeric_kind(hints[item.name]):
                is_list = typing.get_origin(hints[item.name]) is list
                yield select, prefix + item.name, kind, is_list


def test_every_numeric_option_refuses_what_a_dataset_cannot_hold():
    """One rule for all: NaN and infinity in any float option, integers past int64
    in any integer option (env.kwargs aside: the env's own)."""
    import re

    seen = set()
    for turn, (select, key, kind, is_list) in enumerate(numeric_options()):
        seen.add(key)
        bad = ["nan", "inf", "-inf"] if kind is float else [str(2**64), str(-(2**63) - 1)]
        value = bad[turn % len(bad)]  # each option one of them, each of them several times
        value = f"[{value}]" if is_list else value
        with pytest.raises(ConfigError, match=re.escape(f"{key}=")):
            settings(*select, f"{key}={value}")
    assert {"seed", "policy.noise_scale", "postproc.gamma", "writer.chunk_frames"} <= seen
    assert {"dataset.ref_max_score", "collector.preemptive_threshold", "policy.hidden"} <= seen
