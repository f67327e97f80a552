"""Graphs beyond Planetoid: readers for graphs PyG does not ship (:mod:`.facebook`) and the
train/val/test splits a graph without masks gets (:mod:`.splits`)."""
