"""docs/configuration.md is rendered from conf/ and the dataclasses, and kept up to date."""

from trace_ray.config_reference import PAGE, field_types, read_config_file, render


def test_the_configuration_page_is_up_to_date():
    assert PAGE.read_text(encoding="utf-8") == render(), "docs/configuration.md is out of date: run make docs"


def test_keys_defaults_and_comments_are_read_from_the_yaml(tmp_path):
    path = tmp_path / "group.yaml"
    path.write_text(
        "# What the group is for.\n"
        "name: demo\n"
        "limits:\n"
        "  # above the key\n"
        "  size: 4         # beside the key\n"
        "                  # and its continuation\n"
        "  mode: fast\n"
        "defaults:\n"
        "  - other\n"
    )
    config_file = read_config_file(path, "grp")
    assert config_file.description == ["What the group is for."]
    entries = {entry.key: (entry.value, entry.comment) for entry in config_file.entries}
    assert entries["grp.name"] == ("demo", [])
    assert entries["grp.limits"] == ("", [])
    assert entries["grp.limits.size"] == ("4", ["above the key", "beside the key", "and its continuation"])
    assert entries["grp.limits.mode"] == ("fast", [])
    assert entries["defaults"] == ("other", [])


def test_every_key_of_every_config_file_is_on_the_page_with_its_type():
    page, (types, comments) = render(), field_types()
    assert types["serve.max_concurrent_requests"] == "int" and types["limit"] == "int or null"
    assert types["grpo.clip_eps_high"] == "float or null" and types["calibration.pass_at"] == "list of int"
    assert "| `calibration.start` | `default` | str |" in page
    assert comments["serve.request_timeout_s"].startswith("a reply not finished by then")
