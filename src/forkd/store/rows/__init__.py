"""The registry's tables, one module each: what one owner may read and write of the database."""
