"""Dashboard views: pure functions from gnnpipe tables to HoloViews elements."""
