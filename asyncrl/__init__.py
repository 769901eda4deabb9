"""asyncrl. ``ASYNCRL_FORBID_PICKLE=1`` installs the no-pickle guard (asyncrl/core/net/wireguard.py)."""

from asyncrl.core.net.wireguard import install_from_env as _install_from_env

_install_from_env()
