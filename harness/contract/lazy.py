"""A module loaded on first use: how a command keeps a heavy path of its own off its start-up.

``sbench collect`` sends an adaptive campaign's or a search's next runs through the submit path (planning,
rendering, the executors), but most collects send nothing. Its module names that path as a lazy module at its
top, beside the same import under ``TYPE_CHECKING`` (so the type checker and the import contracts see the link
as an ordinary import); the module's code runs at the first attribute read, only when runs are due::

    if TYPE_CHECKING:
        from harness.campaign import submit
    else:
        submit = lazy_module("harness.campaign.submit")
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy_module(name: str) -> ModuleType:
    """*name*, imported when one of its attributes is first read (its parent packages are imported now). An
    import of it elsewhere, before or after, gets the same module object."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}", name=name)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)  # as an import binds a submodule to its package
    return module
