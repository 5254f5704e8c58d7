"""The names of the built-in networks, without importing torch (for the command line's help)."""

#: The homogeneous presets (``exogym.core.comm.network.PRESETS``).
PRESET_NAMES = ("datacenter", "ethernet", "internet")
#: The named worlds (``exogym.core.comm.world_presets.WORLD_PRESETS``).
WORLD_NAMES = ("two-datacenters", "volunteers")
#: Suffixes of world files.
WORLD_FILE_SUFFIXES = (".json", ".toml")

__all__ = ["PRESET_NAMES", "WORLD_FILE_SUFFIXES", "WORLD_NAMES"]
