"""The backend registry: what the plugin hooks registered, by name.

`default_registry()` loads the built-in backends (as default plugins, through the same hook a
third party uses) and every plugin of the entry-point group `sessionlog`, once per process. Tests
make a fresh `Registry` from their own plugin manager instead of touching the default one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pluggy

from ..core.errors import UnknownBackendError
from ..core.store import BackendInfo
from . import hookspecs

BUILTIN_PLUGINS = (
    "sessionlog.repositories.builtin",
    "sessionlog.backends.jsonl",
    "sessionlog.backends.jsonl_fsync",
    "sessionlog.backends.jsonl_async",
    "sessionlog.backends.jsonl_group",
    "sessionlog.backends.jsonl_syncfs",
    "sessionlog.backends.sqlite",
)


def plugin_manager(
    *, builtins: bool = True, entry_points: bool = True, plugins: Iterable[object] = ()
) -> pluggy.PluginManager:
    """A fresh plugin manager with the sessionlog hooks."""
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    if builtins:
        import importlib

        for name in BUILTIN_PLUGINS:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as error:
                if error.name != name:
                    raise
                continue  # a backend this build does not ship yet
            manager.register(module, name)
    if entry_points:
        manager.load_setuptools_entrypoints(hookspecs.PROJECT)
    for plugin in plugins:
        manager.register(plugin)
    return manager


class Registry(Mapping[str, BackendInfo]):
    """Backend name -> BackendInfo; `factory(name)` gives the opener."""

    def __init__(self, manager: pluggy.PluginManager) -> None:
        self._factories: dict[str, Callable[..., Any]] = {}
        self._infos: dict[str, BackendInfo] = {}
        self._repositories: dict[str, Callable[..., Any]] = {}
        manager.hook.register_backends(register=self._register)
        manager.hook.register_repositories(register=self._register_repository)

    def _register(self, name: str, factory: Callable[..., Any], info: BackendInfo) -> None:
        if name in self._infos:
            raise ValueError(f"backend {name!r} is registered twice")
        if info.name != name:
            raise ValueError(f"backend {name!r} registered with info named {info.name!r}")
        self._factories[name] = factory
        self._infos[name] = info

    def _register_repository(self, scheme: str, factory: Callable[..., Any]) -> None:
        if scheme in self._repositories:
            raise ValueError(f"repository scheme {scheme!r} is registered twice")
        self._repositories[scheme] = factory

    def repository_factory(self, scheme: str) -> Callable[..., Any]:
        """The opener of `scheme://` repositories; ValueError naming the schemes there are."""
        try:
            return self._repositories[scheme]
        except KeyError:
            known = ", ".join(sorted(self._repositories)) or "none"
            raise ValueError(f"no repository for {scheme}:// locations; registered: {known}") from None

    def factory(self, name: str) -> Callable[..., Any]:
        try:
            return self._factories[name]
        except KeyError:
            raise UnknownBackendError(name, self._infos) from None

    def info(self, name: str) -> BackendInfo:
        try:
            return self._infos[name]
        except KeyError:
            raise UnknownBackendError(name, self._infos) from None

    def __getitem__(self, name: str) -> BackendInfo:
        # A plain KeyError: `in` and `get` of the Mapping protocol rely on it. `info` and
        # `factory` (what opening uses) raise UnknownBackendError, which lists the names.
        return self._infos[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._infos))

    def __len__(self) -> int:
        return len(self._infos)


@functools.cache
def default_registry() -> Registry:
    return Registry(plugin_manager())
