"""``buffer.passwords_dir``: the ACL users' passwords read from files (a Kubernetes Secret's
volume), checked as strictly as ``buffer.url_file``, and preferred over a restart's previous
ones; no message quotes a password. (The server itself: tests/integration/test_redis_passwords.py.)"""

from __future__ import annotations

import re

import pytest

from asyncrl.buffer.service.files import ROLE_USERS, read_passwords
from asyncrl.buffer.service.server import RedisOptions, RedisServer
from asyncrl.core.config.load import ConfigError, load_config
from asyncrl.orchestration.launch.buffer_start import given_passwords

PASSWORDS = {"actor": "a" * 16 + "-actor.~_", "learner": "0123456789abcdef0123"}


def write_dir(path, passwords=PASSWORDS, mode=0o400):
    path.mkdir(exist_ok=True)
    for user, text in passwords.items():
        (path / user).write_text(text)
        (path / user).chmod(mode)
    return path


def test_the_users_passwords_are_read_as_they_are(tmp_path):
    assert read_passwords(write_dir(tmp_path / "pw")) == PASSWORDS
    assert set(PASSWORDS) == set(ROLE_USERS)


def test_a_symlinked_file_counts_by_its_target_as_in_a_secret_volume(tmp_path):
    data = write_dir(tmp_path / "..data")  # a Secret volume: key -> ..data/key
    links = tmp_path / "pw"
    links.mkdir()
    for user in PASSWORDS:
        (links / user).symlink_to(data / user)
    assert read_passwords(links) == PASSWORDS


@pytest.mark.parametrize(
    ("passwords", "mode", "message"),
    [
        ({**PASSWORDS, "actor": PASSWORDS["actor"] + "\n"}, 0o600, "actor ends with a newline"),
        ({**PASSWORDS, "learner": "short"}, 0o600, "learner holds no valid password"),
        ({**PASSWORDS, "actor": "has space in it 0123"}, 0o600, "actor holds no valid password"),
        ({**PASSWORDS, "actor": "at@sign-breaks-urls"}, 0o600, "actor holds no valid password"),
        (PASSWORDS, 0o640, "is readable by other users (mode 640)"),
        ({"actor": PASSWORDS["actor"]}, 0o400, "learner cannot be read"),
    ],
    ids=["newline", "short", "space", "url-char", "group-readable", "missing"],
)
def test_a_file_that_cannot_serve_is_refused_naming_it_not_its_password(
    tmp_path, passwords, mode, message
):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        read_passwords(write_dir(tmp_path / "pw", passwords, mode))
    for text in passwords.values():
        assert text.strip() not in str(e.value)


def test_the_launch_names_the_key(tmp_path):
    directory = write_dir(tmp_path / "pw", {"actor": PASSWORDS["actor"]})
    cfg = load_config([f"buffer.passwords_dir={directory}"])
    with pytest.raises(ConfigError, match="^buffer.passwords_dir: .*learner cannot be read"):
        given_passwords(cfg)
    assert given_passwords(load_config([])) == {}  # unset: generated


def test_given_passwords_win_over_the_previous_ones_and_stay_out_of_reprs(tmp_path):
    first = RedisServer(tmp_path / "redis")
    first.run_dir.mkdir()
    first.conf_path.write_text(first._config_text())  # what a previous start left
    again = RedisServer(tmp_path / "redis")
    assert again.user_passwords == first.user_passwords  # a restart reuses them
    given = RedisServer(tmp_path / "redis", RedisOptions(user_passwords=PASSWORDS))
    assert given.user_passwords == PASSWORDS
    conf = given._config_text()
    assert all(f">{pw} " in conf for pw in PASSWORDS.values())
    options = RedisOptions(password="admin-secret-0123", user_passwords=PASSWORDS)
    assert "admin-secret" not in repr(options) and PASSWORDS["actor"] not in repr(options)


def test_an_unknown_user_is_refused():
    with pytest.raises(ValueError, match=r"unknown users \['admin'\]"):
        RedisOptions(user_passwords={"admin": "x" * 16})


def test_buffer_port_is_bounded():
    assert load_config(["buffer.port=6379"]).buffer.port == 6379
    with pytest.raises(ConfigError, match=r"buffer.port must be >= 0 and <= 65535 \(0 = a free"):
        load_config(["buffer.port=65536"])
