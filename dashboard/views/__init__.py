"""Dashboard views: pure functions from gnnpipe tables to HoloViews elements."""

__all__: list[str] = []  # the views are imported by module
