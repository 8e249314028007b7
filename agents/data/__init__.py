"""Project data read at run time (compatibility tables)."""
