import pytest

from tunecl import config


def test_from_env_defaults_and_overrides(tmp_path):
    cfg = config.Config.from_env({"TUNECL_DB": str(tmp_path / "x.sqlite"), "TUNECL_DEVICE": "pocl"})
    assert cfg.db_url == "sqlite:///" + str(tmp_path / "x.sqlite")
    assert cfg.device == "pocl"
    assert config.Config.from_env({"TUNECL_DB": "postgresql://u@h/db"}).db_url == "postgresql://u@h/db"
    assert config.Config.from_env({}).device == "0"


def test_tune_mode_from_env():
    assert config.Config.from_env({}).tune == "off"
    assert config.Config.from_env({"TUNECL_TUNE": "ON-MISS"}).tune == "on-miss"
    assert config.Config.from_env({"TUNECL_TUNE": ""}).tune == "off"


def test_override_is_scoped():
    before = config.get()
    with config.override(device="7") as cfg:
        assert cfg.device == "7" and config.get().device == "7"
    assert config.get() == before


def test_winograd_cache_settings_from_env():
    assert (config.Config.from_env({}).winograd_cache, config.Config.from_env({}).winograd_cache_mb) == ("auto", 512)
    cfg = config.Config.from_env({"TUNECL_WINOGRAD_CACHE": "OFF", "TUNECL_WINOGRAD_CACHE_MB": "64"})
    assert (cfg.winograd_cache, cfg.winograd_cache_mb) == ("off", 64)
    with pytest.raises(ValueError, match="TUNECL_WINOGRAD_CACHE_MB"):
        config.Config.from_env({"TUNECL_WINOGRAD_CACHE_MB": "lots"})


def test_optimizer_slots_from_env():
    assert config.Config.from_env({}).optim_slots is None
    assert config.Config.from_env({"TUNECL_OPTIM_SLOTS": "8"}).optim_slots == 8
    assert config.Config.from_env({"TUNECL_OPTIM_SLOTS": "AUTO"}).optim_slots is None
    assert config.Config.from_env({"TUNECL_OPTIM_SLOTS": "32"}).optim_slots == 32
    for bad in ("12", "0", "many", "-8"):
        with pytest.raises(ValueError, match="TUNECL_OPTIM_SLOTS must be 'auto' or one of 1, 2, 3, 4, 5, 6, 7, 8, "
                                             "16, 24, 32"):
            config.Config.from_env({"TUNECL_OPTIM_SLOTS": bad})


def test_derived_settings_follow_the_environment_and_overrides_and_are_cached(monkeypatch):
    calls = []

    def derive(cfg):
        calls.append(cfg.random)
        if cfg.random not in config.RANDOM_MODES:
            raise ValueError(f"bad {cfg.random}")
        return cfg.random

    setting = config.Derived(derive, "TUNECL_RANDOM")
    monkeypatch.delenv("TUNECL_RANDOM", raising=False)
    assert setting() == setting() == "auto" and calls == ["auto"]   # derived once
    monkeypatch.setenv("TUNECL_RANDOM", "HOST")
    assert setting() == "host"
    with config.override(random="device"):
        assert setting() == "device"
    assert setting() == "host" and calls == ["auto", "host", "device", "host"]
    monkeypatch.setenv("TUNECL_RANDOM", "sometimes")
    for _ in range(2):   # a bad value raises at every read
        with pytest.raises(ValueError, match="bad sometimes"):
            setting()
    assert config.Config.from_env({}).random == "auto"
