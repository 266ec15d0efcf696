"""SQL over flightpart: Flight SQL at the catalog's address (:mod:`.server`), run by DuckDB at the catalog over
datasets whose scans reach the nodes (:mod:`.gateway`)."""

from .gateway import Gateway, SqlError
from .server import SqlCatalogServer

__all__ = ["Gateway", "SqlCatalogServer", "SqlError"]
