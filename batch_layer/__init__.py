"""Batch layer: recompute closed intervals from replayed Kafka offsets, with lineage and the batch watermark."""
