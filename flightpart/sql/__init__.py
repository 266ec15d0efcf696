"""SQL over flightpart: Flight SQL at the catalog's address (:mod:`.server`), run by DuckDB at the catalog over
datasets whose scans reach the nodes (:mod:`.gateway`)."""

from .duckdb_errors import SqlError
from .gateway import Gateway
from .server import SqlCatalogServer

__all__ = ["Gateway", "SqlCatalogServer", "SqlError"]
