"""Spark and Kafka adapters for the pure operators: source → serde → time → operator → sink."""
