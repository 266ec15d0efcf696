"""SQL over flightpart: Flight SQL at the catalog (:mod:`.server`), run by DuckDB over the datasets."""

from .duckdb_errors import SqlError
from .gateway import Gateway
from .server import SqlCatalogServer

__all__ = ["Gateway", "SqlCatalogServer", "SqlError"]
