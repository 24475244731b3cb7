"""Packages whose public names are imported with their module on first use."""

import importlib

__all__ = ["lazy_names"]


def lazy_names(package, homes):
    """A module ``__getattr__`` for ``package`` (its ``__name__``): each name of
    ``homes`` (name -> the submodule that defines it) is imported from that module
    when first asked for and then kept in the package's namespace; any other name
    is looked up as a submodule, as ``import`` would have bound it."""
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name):
        home = homes.get(name)
        if home is None:
            try:
                return importlib.import_module(f".{name}", package)
            except ModuleNotFoundError as exc:
                if exc.name != f"{package}.{name}":
                    raise
                raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(f".{home}", package), name)
        namespace[name] = value
        return value

    return __getattr__
