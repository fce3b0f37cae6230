"""Config's fields are generated from the settings table (deploy/config_class.py): the tree agrees
with the table, and a drift either way (a setting added, a default or type changed, a field edited
by hand) fails the check."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import shutil

import pytest

from deploy import config_class
from exporter.config import Config
from exporter.settings import SETTINGS, Integer, Setting, Text

ROOT = pathlib.Path(__file__).resolve().parent.parent




@pytest.fixture
def config_copy(tmp_path):
    path = tmp_path / "config.py"
    shutil.copy(config_class.OUT, path)
    return path


def test_the_config_fields_are_current():
    assert not config_class.stale(), "run `python deploy/config_class.py`"
    assert config_class.main(["--check"]) == 0


def test_every_field_has_its_settings_name_type_and_default():
    by_field = {name: (annotation, default) for name, annotation, default in config_class.fields()}
    for field in dataclasses.fields(Config):
        annotation, default = by_field.pop(field.name)
        assert field.type == annotation, field.name
        assert repr(field.default) == repr(ast.literal_eval(default)), field.name
    assert by_field == {}
    for setting in SETTINGS:
        if setting.field and setting.name != "listen":
            assert getattr(Config(), setting.name) == setting.default, setting.name
    assert (Config().listen_host, Config().listen_port, Config().listen) == ("0.0.0.0", 9480, "0.0.0.0:9480")


def test_a_setting_added_to_the_table_fails_the_check_until_written(config_copy, capsys):
    added = (*SETTINGS, Setting("new_limit", Integer(1, 10), "int", 5, "a setting only this test has"))
    assert config_class.main(["--check"], added, config_copy) == 1
    assert "disagree" in capsys.readouterr().err
    assert config_class.main([], added, config_copy) == 0
    text = config_copy.read_text()
    assert "    new_limit: int = 5\n    # END generated fields\n" in text
    assert config_class.main(["--check"], added, config_copy) == 0
    # Outside the block the file is untouched: only the new field line was added.
    assert len(text) == len(config_class.OUT.read_text()) + len("    new_limit: int = 5\n")
    assert config_class.main(["--check"], SETTINGS, config_copy) == 1  # and the tree's table disagrees now


@pytest.mark.parametrize(("name", "change"), [
    ("listen", {"default": "0.0.0.0:9000"}),  # moves the listen_port field
    ("log_level", {"default": "debug"}),
    ("proc_root", {"annotation": "str | None"}),
])
def test_a_changed_default_or_type_fails_the_check(config_copy, name, change):
    changed = tuple(dataclasses.replace(s, **change) if s.name == name else s for s in SETTINGS)
    assert config_class.main(["--check"], changed, config_copy) == 1


def test_a_field_edited_by_hand_fails_the_check(config_copy):
    config_copy.write_text(config_copy.read_text().replace("    log_level: str = \"info\"\n",
                                                           "    log_level: str = \"debug\"\n"))
    assert config_class.main(["--check"], SETTINGS, config_copy) == 1


def test_a_default_no_literal_can_hold_is_refused(config_copy, capsys):
    odd = (*SETTINGS, Setting("odd", Text(), "object", object(), "a default a field line cannot write"))
    assert config_class.main([], odd, config_copy) == 1
    assert "setting odd" in capsys.readouterr().err
    assert config_copy.read_text() == config_class.OUT.read_text()  # nothing written


def test_a_file_without_the_markers_is_refused(tmp_path, capsys):
    path = tmp_path / "config.py"
    path.write_text("class Config:\n    pass\n")
    assert config_class.main(["--check"], SETTINGS, path) == 1
    assert "markers" in capsys.readouterr().err
