"""The Kafka source: offset ranges planned on the driver, records read, decoded and checked on executors."""
