"""hangwatch node agent: finds the training ranks on this node, samples them, reports to the monitor."""

try:
    from importlib.metadata import version as _version

    __version__ = _version("hangwatch")
except Exception:  # noqa: BLE001 -- not installed (running from a checkout)
    __version__ = "0.0.0"
