"""Avro: the job schemas, Confluent / single-object framing, bulk decode to columns and bulk encode."""
