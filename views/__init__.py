"""Views: the one definition of buckets, slices and the sketch aggregation, shared by both layers."""
